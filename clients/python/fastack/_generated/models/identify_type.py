from enum import Enum


class IdentifyType(str, Enum):
    IDENTIFY = "identify"

    def __str__(self) -> str:
        return str(self.value)
