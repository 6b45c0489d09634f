"""hydra_ops.registry.Registry: one way to register and look up implementations by name."""

from __future__ import annotations

import json.decoder

import pytest

from hydra_ops.registry import Registry


def test_register_get_names_in_registration_order():
    reg: Registry[int] = Registry("thing")
    assert reg.register("b", 2) == 2 and reg.register("a", 1) == 1
    assert reg.names() == ("b", "a") and list(reg) == ["b", "a"] and len(reg) == 2
    assert reg.get("a") == 1 and reg["b"] == 2 and "a" in reg and "c" not in reg and 3 not in reg
    assert dict(reg.items()) == {"b": 2, "a": 1}


def test_unknown_taken_and_reserved_names_fail_in_one_line():
    reg: Registry[int] = Registry("thing", reserved=("auto",))
    reg.register("x", 1)
    with pytest.raises(ValueError, match=r"^thing='y' is unknown; registered: x$"):
        reg.get("y")
    with pytest.raises(ValueError, match=r"^kind='y' is unknown; registered: x$"):
        reg.get("y", "kind")
    assert reg.unknown("y", "kind", also=("auto",)) == "kind='y' is unknown; registered: auto, x"
    with pytest.raises(ValueError, match=r"^thing 'x' is already registered; registered: x$"):
        reg.register("x", 2)
    with pytest.raises(ValueError, match="'auto' is reserved"):
        reg.register("auto", 3)
    with pytest.raises(ValueError, match="non-empty string"):
        reg.register("", 4)
    assert reg.get("x") == 1 and reg.names() == ("x",)


def test_a_lazy_entry_is_imported_on_first_get_only():
    reg: Registry[type] = Registry("decoder", package="json")
    reg.register_lazy("json", ".decoder:JSONDecoder")
    reg.register_lazy("missing", ".no_such_module:Nothing")
    assert reg.names() == ("json", "missing")  # listing imports nothing
    assert reg.get("json") is json.decoder.JSONDecoder and reg["json"] is reg.get("json")
    with pytest.raises(ModuleNotFoundError):
        reg.get("missing")
    with pytest.raises(ValueError, match="'module:Attr'"):
        reg.register_lazy("bad", "json.decoder")


def test_unregister_removes_what_a_test_added():
    reg: Registry[int] = Registry("thing")
    reg.register("x", 1)
    assert reg.unregister("x") == 1 and reg.names() == ()
    with pytest.raises(ValueError, match="is unknown"):
        reg.unregister("x")
