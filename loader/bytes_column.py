"""A byte field whose ``bytes`` objects were made by the gather itself.

At ``num_workers=0`` with ``bytes_as="bytes"`` the batch reader gathers a
field's large values straight into the ``bytes`` handed out
(formats/engine/into_bytes.py), so the column is those objects: the user gets
the list as it is, never a second copy.
"""

from __future__ import annotations


class BytesList:
    """The batch's values of one field as ``bytes`` (None where a sample lacks it); made for this
    batch alone and never written after the gather checked them."""

    __slots__ = ("values",)

    def __init__(self, values: list):
        self.values = values

    def __len__(self) -> int:
        return len(self.values)

    def __getitem__(self, i):
        return self.values[i]

    def to_list(self) -> list:
        return self.values
