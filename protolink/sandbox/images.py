"""The images the project builds, by name, and how to get one the engine does not have.

Standard library only: the ``exec`` path, which is timed, imports it through the engine's errors.
"""

from __future__ import annotations

DEFAULT_IMAGE = "protolink/sandbox:latest"
#: The images scripts/build-images.sh builds, by the name it takes (which ``ensure_image`` and a
#: sandbox's configuration also accept): the tag of the latest build and the make target that builds it.
BUILT_IMAGES = {
    "sandbox": (DEFAULT_IMAGE, "make image"),
    "ci": ("protolink/ci:latest", "make ci-image"),
}


def built_kind(image: str) -> str | None:
    """Which of :data:`BUILT_IMAGES` ``image`` names (``ci`` or ``protolink/ci:latest``), or None."""
    for kind, (latest, _) in BUILT_IMAGES.items():
        if image in (kind, latest):
            return kind
    return None


def image_reference(image: str) -> str:
    """``image`` as the engine knows it: a built image's short name (``sandbox``, ``ci``) is its
    ``:latest`` tag; any other reference is itself."""
    kind = built_kind(image)
    return BUILT_IMAGES[kind][0] if kind is not None else image


def missing_image_hint(image: str) -> str:
    """How to get ``image`` when the engine does not have it."""
    kind = built_kind(image)
    if kind is not None:
        return f"build it with `{BUILT_IMAGES[kind][1]}` in a protolink checkout"
    return "pull it where a registry is reachable, or build it"
