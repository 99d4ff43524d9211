from enum import Enum


class JobKind(str, Enum):
    ERASURE = "erasure"
    EXPORT = "export"
    RETENTION = "retention"

    def __str__(self) -> str:
        return str(self.value)
