"""The API's data models (generated from openapi/openapi.json).

Responses are attrs classes: `EventOut`, `ContactOut`, `JobOut`, `Ack`, ...
A field the server left out is `UNSET` (falsy); `to_dict()` gives the JSON.
Free-form objects (`properties`, `traits`, `metadata`) behave like dicts
(`ev.properties["plan"]`, `ev.properties.to_dict()`).
"""

from ._generated.models import *  # noqa: F403
from ._generated.models import __all__ as _models_all
from ._generated.types import UNSET, Unset

__all__ = [*_models_all, "UNSET", "Unset"]

from typing import Union as _Union

from ._generated.models import BatchIdentify as _BatchIdentify
from ._generated.models import BatchTrack as _BatchTrack

#: One item of a batch: a `BatchTrack` or a `BatchIdentify`.
BatchItem = _Union[_BatchTrack, _BatchIdentify]
__all__ += ["BatchItem"]
