"""PLACEHOLDER: replaced by its owner this session."""


class LocalProcesses:
    pass
