"""Serialisation rules shared by every resource model.

One rule for every type ("omitempty everywhere", see docs/contracts.md): camelCase keys,
None, "", [] and {} are omitted; booleans and integers are optional and emitted when set.
Unknown fields are kept, because the API server adds fields we do not model and a
round-trip must never drop them.
"""

from __future__ import annotations

from events.records import Record, to_camel


class WireModel(Record):
    """Base of every resource model: camelCase on the wire, omitempty on the way out.

    omitempty applies to modelled fields only. Unknown fields are written back verbatim: an
    `emptyDir: {}` volume, a label with an empty value and the `{}` markers of managedFields
    are meaningful, and pruning them would corrupt the object.
    """

    extra = "allow"
    wire_names = to_camel
    omit_empty = True
