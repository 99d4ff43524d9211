from enum import Enum


class JobKind(str, Enum):
    EXPORT = "export"
    RETENTION = "retention"

    def __str__(self) -> str:
        return str(self.value)
