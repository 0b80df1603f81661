"""bench/bundle.py (CPU only): the staged programs split into bundles under the size limit, each
a readable .tar.xz with the install tree, its own models and a manifest of just those."""
from __future__ import annotations

import json
import os
import sys
import tarfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))
import bundle  # noqa: E402

MIB = 2**17  # a unit of the sizes below: small, as xz is slow on incompressible data


def entry(key, precision):
    return {"key": key, "precision": precision, "pte": f"{key}_{precision}.pte",
            "pte_device_resident": f"{key}_{precision}_device.pte",
            "inputs": [{"file": f"{key}_input_0.bin"}], "outputs": [{"file": f"{key}_expected_0.bin"}]}


def make_stage(root: Path, sizes: dict) -> Path:
    """A staging folder whose model files are incompressible (random bytes)."""
    stage = root / "stage"
    (stage / "site" / "bin").mkdir(parents=True)
    (stage / "site" / "bin" / "kiln_runner").write_bytes(os.urandom(MIB // 4))
    (stage / "tests").mkdir()
    (stage / "tests" / "engine_gpu_test").write_bytes(b"test binary")
    models = stage / "models"
    models.mkdir()
    manifest = []
    for key, mib in sizes.items():
        for precision in ("fp32", "bf16"):
            e = entry(key, precision)
            manifest.append(e)
            for name in (e["pte"], e["pte_device_resident"]):
                (models / name).write_bytes(os.urandom(int(mib * MIB / 4)))
        (models / f"{key}_input_0.bin").write_bytes(b"in")
        (models / f"{key}_expected_0.bin").write_bytes(b"out")
    (models / "manifest.json").write_text(json.dumps(manifest))
    return stage


def unpack(path: Path) -> dict:
    with tarfile.open(path, ignore_zeros=True) as tar:
        return {m.name: tar.extractfile(m).read() for m in tar.getmembers() if m.isfile()}


def test_bundles_stay_under_the_limit_and_hold_every_model_once(tmp_path):
    stage = make_stage(tmp_path, {"a": 1.0, "b": 1.0, "c": 0.5, "d": 1.2})
    written = bundle.pack(stage, tmp_path / "out" / "stage", limit=int(1.8 * MIB), max_keys=10)
    assert [p.name for p, _, _ in written] == [f"stage-{i}.tar.xz" for i in range(1, len(written) + 1)]
    seen = []
    for i, (path, size, keys) in enumerate(written):
        assert size == path.stat().st_size <= 1.8 * MIB
        files = unpack(path)
        assert "site/bin/kiln_runner" in files
        assert ("tests/engine_gpu_test" in files) == (i == 0)  # the GPU tests travel once
        manifest = json.loads(files["models/manifest.json"])
        assert sorted({e["key"] for e in manifest}) == sorted(keys)
        for e in manifest:
            assert files[f"models/{e['pte']}"] == (stage / "models" / e["pte"]).read_bytes()
        seen += keys
    assert sorted(seen) == ["a", "b", "c", "d"]


def test_max_keys_and_one_bundle(tmp_path):
    stage = make_stage(tmp_path, {"a": 0.1, "b": 0.1, "c": 0.1})
    written = bundle.pack(stage, tmp_path / "out" / "stage", limit=60 * MIB, max_keys=2)
    assert [keys for _, _, keys in written] == [["a", "b"], ["c"]]
    written = bundle.pack(stage, tmp_path / "out" / "stage", limit=60 * MIB, max_keys=10)
    assert [(p.name, keys) for p, _, keys in written] == [("stage.tar.xz", ["a", "b", "c"])]
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == ["stage.tar.xz"]  # old parts removed


def test_plan_gives_an_oversized_model_its_own_bundle():
    assert bundle.plan({"a": 5, "big": 50, "b": 5}, fixed=10, first_extra=5, limit=40, max_keys=9) == \
        [["a"], ["big"], ["b"]]
