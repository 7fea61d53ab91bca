"""A small declarative validator for the inventory's typed section, standard library only.

Every mctl command loads the inventory first, so this sits on the start-up path of
each of them: pydantic cost ~150 ms of CPU here (its import, the models' classes,
their schema build on first use), a fifth of a whole `mctl rack inventory` on an
18-tray rack (docs/decisions.md, D10). What the inventory needs is small: scalar
types with pydantic's lax conversions, choices, bounds, patterns, optional values,
lists, mappings and nested sections, unknown keys refused, and every problem
reported with its location. Errors are dicts shaped like pydantic's
(loc, type, msg, input, and the field's hint where it has one) so the loader locates them by file and line.

    class SSHSettings(Spec):
        user = F(str, "root")
        port = F(int, 22, ge=1, le=65535)

    SSHSettings.model_validate({"port": 2222}).port   # 2222
    SSHSettings(port=0)                                # SpecError (a ValueError)
"""

from __future__ import annotations

import math
import re
from typing import Any, Callable, Iterable

from mctl.model.names import has_control

_MISSING: Any = object()


class SpecError(ValueError):
    """One or more problems: dicts with loc (tuple), type, msg and input."""

    def __init__(self, errors: list[dict]):
        self._errors = errors
        super().__init__("; ".join(f"{'.'.join(map(str, e['loc'])) or '(top)'}: {e['msg']}" for e in errors))

    def errors(self) -> list[dict]:
        return list(self._errors)


# --- kinds of value --------------------------------------------------------------------------------

class Opt:
    """The kind, or None."""

    def __init__(self, kind: Any):
        self.kind = kind


class OneOf:
    """One of the given values (typing.Literal)."""

    def __init__(self, *values: Any):
        self.values = values


class Either:
    """A value of any of the given scalar kinds, tried in order for an exact type first (bool | str)."""

    def __init__(self, *kinds: type):
        self.kinds = kinds


class ListOf:
    def __init__(self, item: Any):
        self.item = item


class DictOf:
    def __init__(self, key: Any, value: Any):
        self.key, self.value = key, value


ANY = object()          # any value, taken as it is

_BOOL_WORDS = {"true": True, "t": True, "yes": True, "y": True, "on": True, "1": True,
               "false": False, "f": False, "no": False, "n": False, "off": False, "0": False}
_SCALAR_NAMES = {str: "string", int: "integer", float: "number", bool: "boolean"}


class F:
    """A field: its kind, its default (or default factory) and its bounds."""

    __slots__ = ("kind", "default", "factory", "ge", "gt", "le", "pattern", "hint", "_rx")

    def __init__(self, kind: Any, default: Any = _MISSING, *, factory: Callable[[], Any] | None = None,
                 ge: float | None = None, gt: float | None = None, le: float | None = None,
                 pattern: str | None = None, hint: str | None = None):
        self.kind, self.default, self.factory = kind, default, factory
        self.ge, self.gt, self.le, self.pattern = ge, gt, le, pattern
        self.hint = hint                    # what the operator should write, on every error of this field
        self._rx = re.compile(pattern) if pattern else None

    @property
    def required(self) -> bool:
        return self.default is _MISSING and self.factory is None

    def make_default(self) -> Any:
        return self.factory() if self.factory is not None else self.default


def _error(errors: list, loc: tuple, kind: str, msg: str, value: Any) -> Any:
    errors.append({"loc": loc, "type": kind, "msg": msg, "input": value})
    return _MISSING


def _scalar(kind: type, value: Any, loc: tuple, errors: list) -> Any:
    name = _SCALAR_NAMES[kind]
    if kind is str:
        if not isinstance(value, str):
            return _error(errors, loc, "string_type", "Input should be a valid string", value)
        if has_control(value):
            # A newline in a name or setting would add lines to slurm.conf, known_hosts or a shell command;
            # an invisible character (a bidi override, a zero-width space) makes it read as another value.
            _error(errors, loc, "string_control", "control characters (newline, tab, ...) are not allowed", value)
            errors[-1]["hint"] = "a name or setting is one line of plain text: remove the line break, tab or the like"
            return _MISSING
        return value
    if kind is bool:
        if isinstance(value, bool):
            return value
        if isinstance(value, int) and value in (0, 1):
            return bool(value)
        if isinstance(value, str) and value.strip().lower() in _BOOL_WORDS:
            return _BOOL_WORDS[value.strip().lower()]
        return _error(errors, loc, "bool_type", "Input should be a valid boolean", value)
    if isinstance(value, bool):
        return _error(errors, loc, f"{kind.__name__}_type", f"Input should be a valid {name}", value)
    if isinstance(value, str):
        try:
            number = kind(value.strip())
        except ValueError:
            return _error(errors, loc, f"{kind.__name__}_parsing", f"Input should be a valid {name}, unable to parse "
                          f"string as {'an integer' if kind is int else 'a number'}", value)
        return _finite(number, loc, errors, value)
    if kind is int:
        if isinstance(value, int):
            return value
        if isinstance(value, float):
            if not math.isfinite(value):
                return _finite(value, loc, errors, value)
            if value.is_integer():
                return int(value)
            return _error(errors, loc, "int_from_float",
                          "Input should be a valid integer, got a number with a fractional part", value)
        return _error(errors, loc, "int_type", "Input should be a valid integer", value)
    if isinstance(value, (int, float)):     # float
        try:
            return _finite(float(value), loc, errors, value)
        except OverflowError:               # an integer beyond a float's range
            return _error(errors, loc, "finite_number", "Input should be a finite number", value)
    return _error(errors, loc, "float_type", "Input should be a valid number", value)


def _finite(number: Any, loc: tuple, errors: list, given: Any) -> Any:
    """NaN passes every range check (all comparisons are false) and infinity is no timeout: refuse both."""
    if isinstance(number, float) and not math.isfinite(number):
        return _error(errors, loc, "finite_number", "Input should be a finite number (not NaN or infinity)", given)
    return number


def _choices(values: Iterable[Any]) -> str:
    shown = [repr(v) for v in values]
    return shown[0] if len(shown) == 1 else f"{', '.join(shown[:-1])} or {shown[-1]}"


def check(kind: Any, value: Any, loc: tuple, errors: list) -> Any:
    """The value converted to *kind*, or _MISSING with the problems appended to *errors*."""
    if kind is ANY:
        return value
    if isinstance(kind, Opt):
        return None if value is None else check(kind.kind, value, loc, errors)
    if kind in _SCALAR_NAMES:
        return _scalar(kind, value, loc, errors)
    if isinstance(kind, OneOf):
        if any(value == v and type(value) is type(v) for v in kind.values):
            return value
        return _error(errors, loc, "literal_error", f"Input should be {_choices(kind.values)}", value)
    if isinstance(kind, Either):
        for k in kind.kinds:
            if type(value) is k:
                return _scalar(k, value, loc, errors)
        names = " or ".join(_SCALAR_NAMES[k] for k in kind.kinds)
        return _error(errors, loc, "union_type", f"Input should be a valid {names}", value)
    if isinstance(kind, ListOf):
        if not isinstance(value, (list, tuple)):
            return _error(errors, loc, "list_type", "Input should be a valid list", value)
        out, ok = [], True
        for i, item in enumerate(value):
            v = check(kind.item, item, loc + (i,), errors)
            ok = ok and v is not _MISSING
            out.append(v)
        return out if ok else _MISSING
    if isinstance(kind, DictOf):
        if not isinstance(value, dict):
            return _error(errors, loc, "dict_type", "Input should be a valid dictionary", value)
        out, ok = {}, True
        for k, v in value.items():
            key = check(kind.key, k, loc + (k,), errors)
            val = check(kind.value, v, loc + (k,), errors)
            ok = ok and key is not _MISSING and val is not _MISSING
            out[key] = val
        return out if ok else _MISSING
    if isinstance(kind, type) and issubclass(kind, Spec):
        if isinstance(value, kind):
            return value
        if not isinstance(value, dict):
            return _error(errors, loc, "model_type",
                          f"Input should be a valid dictionary or instance of {kind.__name__}", value)
        obj = kind.__new__(kind)
        return obj if obj._fill(value, loc, errors) else _MISSING
    raise TypeError(f"spec: unknown kind {kind!r}")


def _bounded(f: F, value: Any, given: Any, loc: tuple, errors: list) -> Any:
    """*value* (converted from *given*) within the field's bounds and pattern, else _MISSING."""
    if value is None or value is _MISSING:
        return value
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        if f.ge is not None and not value >= f.ge:
            return _error(errors, loc, "greater_than_equal", f"Input should be greater than or equal to {f.ge}", given)
        if f.gt is not None and not value > f.gt:
            return _error(errors, loc, "greater_than", f"Input should be greater than {f.gt}", given)
        if f.le is not None and not value <= f.le:
            return _error(errors, loc, "less_than_equal", f"Input should be less than or equal to {f.le}", given)
    if f._rx is not None and isinstance(value, str) and not f._rx.search(value):
        return _error(errors, loc, "string_pattern_mismatch", f"String should match pattern '{f.pattern}'", given)
    return value


def _plain(value: Any) -> Any:
    if isinstance(value, Spec):
        return value.model_dump()
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    return value


def _frozen(value: Any) -> Any:
    if isinstance(value, dict):
        return tuple((k, _frozen(v)) for k, v in value.items())
    if isinstance(value, (list, tuple)):
        return tuple(_frozen(v) for v in value)
    return value


class Spec:
    """A section of the inventory: fields declared as F(...) class attributes, unknown keys refused,
    instances frozen. `model_fields` maps each field name to its F, in declaration order."""

    model_fields: dict[str, F] = {}

    def __init_subclass__(cls, **kw):
        super().__init_subclass__(**kw)
        fields = {}
        for base in reversed(cls.__mro__[1:]):
            fields.update(getattr(base, "model_fields", {}))
        for name, value in list(vars(cls).items()):
            if isinstance(value, F):
                fields[name] = value
                delattr(cls, name)
        cls.model_fields = fields

    def __init__(self, **data: Any):
        errors: list = []
        if not self._fill(data, (), errors):
            raise SpecError(errors)

    @classmethod
    def model_validate(cls, data: Any):
        errors: list = []
        value = check(cls, data, (), errors)
        if errors or value is _MISSING:
            raise SpecError(errors)
        return value

    def _fill(self, data: dict, loc: tuple, errors: list) -> bool:
        before = len(errors)
        fields = self.model_fields
        for key, given in data.items():                 # in the document's order, as an operator reads it
            f = fields.get(key) if isinstance(key, str) else None
            if f is None:
                _error(errors, loc + (key,), "extra_forbidden", "Extra inputs are not permitted", given)
                continue
            mark = len(errors)
            value = _bounded(f, check(f.kind, given, loc + (key,), errors), given, loc + (key,), errors)
            if f.hint:
                for err in errors[mark:]:
                    err.setdefault("hint", f.hint)
            object.__setattr__(self, key, value)
        for name, f in fields.items():
            if name in data:
                continue
            if f.required:
                value = _error(errors, loc + (name,), "missing", "Field required", data)
            else:
                value = f.make_default()
            object.__setattr__(self, name, value)
        return len(errors) == before

    def __setattr__(self, name: str, value: Any) -> None:
        raise AttributeError(f"{type(self).__name__} is frozen")

    def model_dump(self, mode: str | None = None) -> dict[str, Any]:
        return {name: _plain(getattr(self, name)) for name in self.model_fields}

    def __eq__(self, other: object) -> bool:
        return type(other) is type(self) and other.model_dump() == self.model_dump()

    def __hash__(self) -> int:
        return hash((type(self).__name__, _frozen(self.model_dump())))

    def __repr__(self) -> str:
        return f"{type(self).__name__}({', '.join(f'{n}={getattr(self, n)!r}' for n in self.model_fields)})"
