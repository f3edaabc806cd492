"""The SDK's error table matches the error codes of the API contract (api/openapi.yaml)."""

from __future__ import annotations

import pathlib
import re

from warren import _errors

SPEC = pathlib.Path(__file__).resolve().parents[3] / "api" / "openapi.yaml"


def spec_error_codes() -> list:
    """The ``enum`` of ``components.schemas.ErrorCode``, read from the YAML text."""
    text = SPEC.read_text()
    block = re.search(r"\n    ErrorCode:\n(.*?)\n\n", text, re.S)
    assert block, f"no ErrorCode schema in {SPEC}"
    enum = block.group(1).split("enum:", 1)[1]
    return re.findall(r"^\s+- ([a-z_]+)\s*$", enum, re.M)


def test_every_code_of_the_spec_has_its_exception_and_no_other() -> None:
    codes = spec_error_codes()
    assert len(codes) >= 10, codes
    assert sorted(_errors._BY_CODE) == sorted(codes)


def test_each_exception_carries_its_own_code() -> None:
    for code, cls in _errors._BY_CODE.items():
        assert cls.default_code == code, (code, cls)
        e = _errors.error_from_body(409, {"error": {"code": code, "message": "m"}})
        assert type(e) is cls and e.code == code


def test_every_error_class_is_exported_from_the_package() -> None:
    import inspect

    import warren

    classes = {
        n for n, v in vars(_errors).items() if inspect.isclass(v) and issubclass(v, _errors.WarrenError)
    }
    assert "StepInterrupted" in classes and "NodeUnreachable" in classes
    for name in classes:
        assert getattr(warren, name, None) is getattr(_errors, name), f"warren.{name} is not exported"
        assert name in warren.__all__, name
        assert name in _errors.__all__, name
