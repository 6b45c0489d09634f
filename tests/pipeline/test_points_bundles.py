"""The studies' points kept in ``benchmarks/studies/*.bundle`` restore with the documented command
(docs/study.md): each bundle verifies against this repository's history, the five studies'
bundle fetched into a clone gives the study commit and its 100 finished points, and each 12-layer
study's bundle holds points of the variants and seeds its spec registered, and no other, at a
commit whose stage code is the other's."""

from __future__ import annotations

import subprocess

import pytest
from conftest import REPO

BUNDLES = sorted((REPO / "benchmarks" / "studies").glob("*.bundle"))
FIVE_STUDIES = REPO / "benchmarks/studies/fashion-mnist-text-evidence-brown-genres-points.bundle"
#: The 12-layer studies' bundles, by study.
TWELVE_LAYERS = {
    name: REPO / f"benchmarks/studies/{name}-points.bundle"
    for name in ("mpnet-bbc-news", "mpnet-brown-genres")
}


def _git(*args: str, cwd=REPO) -> str:
    return subprocess.run(
        ["git", *args], cwd=cwd, capture_output=True, text=True, check=True
    ).stdout


@pytest.fixture(scope="module", autouse=True)
def history():
    inside = subprocess.run(["git", "rev-parse"], cwd=REPO, capture_output=True).returncode == 0
    if not inside or _git("rev-parse", "--is-shallow-repository").strip() == "true":
        pytest.skip(
            "not a full git checkout: a bundle's prerequisites are this repository's history"
        )


def test_the_bundles_are_named_by_their_studies():
    assert [b.name for b in BUNDLES] == [
        FIVE_STUDIES.name,
        *(b.name for b in TWELVE_LAYERS.values()),
        "text-points.bundle",
    ]


@pytest.mark.parametrize("study", sorted(TWELVE_LAYERS))
def test_the_12_layer_points_are_of_the_variants_their_specs_registered(study):
    import yaml

    spec = yaml.safe_load((REPO / "benchmarks/studies" / f"{study}.yaml").read_text())
    registered = {f"{v}-seed{s}" for v in spec["variants"] for s in spec["confirm_seeds"]}
    heads = _git("bundle", "list-heads", str(TWELVE_LAYERS[study])).splitlines()
    points = {line.rsplit("/", 1)[1] for line in heads if "refs/exps/" in line}
    assert points and points <= registered, points - registered


def test_the_12_layer_studies_ran_the_same_stage_code(tmp_path):
    """The two tasks' points ran at two commits; what their stages ran (the code DVC hashes, the
    DAG, the hardware records) is the same at both, so the by-size tables compare like with
    like."""
    clone = tmp_path / "study"
    _git("clone", "-q", "--no-checkout", "--shared", str(REPO), str(clone))
    commits = []
    for study, bundle in sorted(TWELVE_LAYERS.items()):
        _git("fetch", "-q", str(bundle), f"HEAD:refs/heads/{study}", cwd=clone)
        commits.append(_git("rev-parse", study, cwd=clone).strip())
    stage_code = ["tasks", "hydra_ops", "dvc.yaml", "params.yaml", "hardware"]
    assert _git("diff", "--stat", *commits, "--", *stage_code, cwd=clone) == ""


@pytest.mark.parametrize("bundle", BUNDLES, ids=lambda b: b.name)
def test_each_bundle_verifies_against_this_history(bundle):
    subprocess.run(["git", "bundle", "verify", "-q", str(bundle)], cwd=REPO, check=True)


def test_the_documented_fetch_restores_the_study_commit_and_its_points(tmp_path):
    clone = tmp_path / "study"
    _git("clone", "-q", "--no-checkout", "--shared", str(REPO), str(clone))
    _git(
        "fetch",
        "-q",
        str(FIVE_STUDIES),
        "HEAD:refs/heads/study",
        "refs/exps/*:refs/exps/*",
        cwd=clone,
    )
    assert _git("rev-parse", "--short=7", "study", cwd=clone).strip() == "4c3ee12"
    refs = _git("for-each-ref", "--format=%(refname)", "refs/exps", cwd=clone).split()
    assert len(refs) == 100
    variants = {r.rsplit("/", 1)[1].rsplit("-seed", 1)[0] for r in refs}
    assert {"bg-default", "bg-heads2"} <= variants
