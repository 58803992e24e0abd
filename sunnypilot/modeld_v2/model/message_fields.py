"""A message's fields as the fill functions build them and the daemons serialize them: {dotted path: value}, one field per entry
("laneLines.2.y": one element of a struct list; "action.desiredCurvature": a field of a nested struct)."""
from __future__ import annotations

from collections.abc import Sequence

import numpy as np

# what one field takes: a number, flag or enum value, text, bytes (rawPredictions), or the values of a list field (an array, mostly a view of
# the parse's buffer; a 0-d array is one value)
FieldValue = bool | int | float | str | bytes | np.ndarray | Sequence[float]
Fields = dict[str, FieldValue]
