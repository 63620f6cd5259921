"""The switches that keep Git from running a repository's code: one set for the git tool and
for the CI runner's clone.

With system and global configuration, terminal prompts, optional locks, hooks, fsmonitor,
signing and the pager off, a Git command runs no program the repository names, except the
clean and smudge filters its own configuration may define.
"""

from __future__ import annotations

import re
from collections.abc import Mapping

#: Options before the subcommand: no pager, literal pathspecs, and no hooks, fsmonitor,
#: signing or signature verification (which would run a configured gpg program).
GLOBAL_OPTIONS = (
    "--no-pager",
    "--literal-pathspecs",
    "-c", "core.hooksPath=/dev/null",
    "-c", "core.fsmonitor=false",
    "-c", "commit.gpgSign=false",
    "-c", "tag.gpgSign=false",
    "-c", "log.showSignature=false",
)
#: Environment forced over the configured one. An empty GIT_ASKPASS also stops Git from
#: consulting core.askPass and SSH_ASKPASS; with terminal prompts off, nothing can prompt.
GIT_ENVIRONMENT = {
    "GIT_CONFIG_NOSYSTEM": "1",
    "GIT_CONFIG_GLOBAL": "/dev/null",
    "GIT_TERMINAL_PROMPT": "0",
    "GIT_ASKPASS": "",
    "SSH_ASKPASS": "",
    "SSH_ASKPASS_REQUIRE": "never",
    "GIT_OPTIONAL_LOCKS": "0",
    "GIT_PAGER": "cat",
    "PAGER": "cat",
}
#: Configured variables that could undo the switches above (injected configuration, an
#: external diff program) are left out of the process environment.
_OVERRIDING_VARIABLES = re.compile(
    r"GIT_CONFIG_PARAMETERS|GIT_CONFIG_COUNT|GIT_CONFIG_(KEY|VALUE)_\d+|GIT_EXTERNAL_DIFF"
)


def git_environment(env: Mapping[str, str]) -> dict[str, str]:
    """The process environment: ``env`` without overriding variables, plus the safety switches."""
    kept = {key: value for key, value in env.items() if not _OVERRIDING_VARIABLES.fullmatch(key)}
    return {**kept, **GIT_ENVIRONMENT}
