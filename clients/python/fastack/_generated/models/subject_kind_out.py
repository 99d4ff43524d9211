from enum import Enum


class SubjectKindOut(str, Enum):
    ANONYMOUS_ID = "anonymous_id"
    CONTACT_ID = "contact_id"
    USER_ID = "user_id"

    def __str__(self) -> str:
        return str(self.value)
