"""The magics' names of the notebook's namespace, and their save sentence."""

from __future__ import annotations

from typing import Any

from transient_nb.notebook.workloads import from_namespace, save


def test_names_of_variables_stand_for_what_they_hold_and_other_text_stays():
    net, pair = object(), ("train", "test")
    ns: dict[str, Any] = {"net": net, "data": pair, "mae": abs, "mine": {"f": len}, "sgd2": min}
    out = from_namespace(
        {
            "model": "net",
            "data": "data",
            "loss": "mse",  # not a variable: a built-in name
            "optimizer": "sgd2",
            "metrics": "mae,accuracy,top=math:sqrt",
            "stop_at": "mae<=0.3",
            "steps": 10,
        },
        ns,
    )
    assert out["model"] is net and out["data"] is pair and out["optimizer"] is min
    assert out["loss"] == "mse" and out["steps"] == 10
    assert out["metrics"] == {"mae": abs, "accuracy": "accuracy", "top": "math:sqrt"}
    assert out["stop_at"] == {"mae": "<=0.3"}
    # An import path or a built-in name is never looked up; a mapping variable is the metrics.
    kept = from_namespace({"model": "pkg.nets:make", "data": "digits", "metrics": "mine"}, ns)
    assert kept["model"] == "pkg.nets:make" and kept["data"] == "digits"
    assert kept["metrics"] == {"f": len}


def test_save_says_where_and_how_to_load():
    class Run:
        id = "run-00000001"

        def save(self, path: str) -> str:
            return "/abs/" + path

    text = save(Run(), "w.pt")
    assert text == (
        "Saved the trained weights of run-00000001 to /abs/w.pt; load them with "
        "model.load_state_dict(torch.load(PATH))."
    )
