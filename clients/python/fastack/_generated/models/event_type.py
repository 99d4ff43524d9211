from enum import Enum


class EventType(str, Enum):
    IDENTIFY = "identify"
    TRACK = "track"

    def __str__(self) -> str:
        return str(self.value)
