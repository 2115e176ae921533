"""Labels and numbers as the wire contract takes them: ids and outcome labels are strings of 1 to
200 characters (an integer is taken as its decimal string), numbers are JSON numbers (no strings,
no booleans)."""

from __future__ import annotations

from typing import Annotated, Any

from pydantic import BeforeValidator, Field, StrictFloat, StrictInt

LABEL_MAX_LENGTH = 200
# Display text (a question, an answer's wording) is for people, not an id: longer than a label.
TEXT_MAX_LENGTH = 2000


def _label_from_int(value: Any) -> Any:
    # Integers are accepted as their decimal string; bools are not integers to a user (JSON's
    # integers are exactly int, its booleans bool).
    return str(value) if type(value) is int else value


def _labels_from_ints(value: Any) -> Any:
    # The same rule for a whole list in one call: one Python call per label was 13 000 calls for
    # an instance of 10⁴ hypotheses and 10³ tests.
    if type(value) is not list:
        return value
    return [str(label) if type(label) is int else label for label in value]


# The length bounds before the validator: pydantic then checks them in its core (Rust), not as one
# more Python call per label (an instance of 10⁴ hypotheses has over 10⁴ labels).
LabelText = Annotated[str, Field(min_length=1, max_length=LABEL_MAX_LENGTH)]
Label = Annotated[LabelText, BeforeValidator(_label_from_int)]
# A list of labels: integers become their decimal strings as for one label, the list at once.
Labels = Annotated[list[LabelText], BeforeValidator(_labels_from_ints)]
Number = StrictFloat | StrictInt
# What people are shown of a test or an outcome (``text``, ``outcome_text``).
DisplayText = Annotated[str, Field(min_length=1, max_length=TEXT_MAX_LENGTH)]
