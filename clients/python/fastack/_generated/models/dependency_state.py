from enum import Enum


class DependencyState(str, Enum):
    DOWN = "down"
    UP = "up"
    WARNING = "warning"

    def __str__(self) -> str:
        return str(self.value)
