"""AgentCard: how an agent describes itself."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field


class AgentCard(BaseModel):
    """The descriptive identity of an agent (name, purpose, address, version, skills)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    name: str = Field(min_length=1, max_length=200)
    description: str = ""
    url: str = ""
    version: str = "1.0.0"
    provider: str | None = None
    documentation_url: str | None = None
    skills: tuple[str, ...] = ()
    tags: tuple[str, ...] = ()

    def to_dict(self) -> dict:
        return self.model_dump(mode="json")

    @classmethod
    def from_dict(cls, data: dict) -> AgentCard:
        return cls.model_validate(data)
