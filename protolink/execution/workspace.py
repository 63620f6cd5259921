"""PLACEHOLDER: replaced by its owner this session."""


class LocalWorkspace:
    pass
