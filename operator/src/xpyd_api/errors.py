"""The one root of xpyd's bad-input errors (pure, no imports): every rejected input, whether a
PDDeployment field, a command-line flag, a scenario file, a trace line or a policy setting, raises a
subclass of `InputError`, which carries the field, the value and the rule it broke. A caller that
reports bad input catches `InputError`, never a bare ValueError (that would also swallow bugs).
Failures of I/O (Kubernetes, an engine's HTTP API, the compiled simulator) are not input errors.
"""

from __future__ import annotations


class InputError(ValueError):
    """A rejected input: `field` (in the caller's terms), `value` and `rule`; the message names all three
    unless the raiser words it (`message`), e.g. with a file and line in front."""

    def __init__(self, field: str, value: object, rule: str, *, message: str | None = None) -> None:
        super().__init__(message if message is not None else f"{field} = {value!r}: {rule}")
        self.field = field
        self.value = value
        self.rule = rule
