"""PLACEHOLDER: replaced by its owner this session."""


class LocalDocuments:
    pass
