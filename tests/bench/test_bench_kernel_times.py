"""bench/kernel_times.py's reading of an Nsight Compute CSV report: kernel names shortened, the
duration metric in any unit, other metrics and the lines before the table ignored, and the summary
per execute."""

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))
import kernel_times  # noqa: E402

HEADER = ('"ID","Process ID","Process Name","Host Name","Kernel Name","Context","Stream",'
          '"Block Size","Grid Size","Device","CC","Section Name","Metric Name","Metric Unit",'
          '"Metric Value"\n')


def row(i, name, metric, unit, value):
    return (f'"{i}","1","kiln_runner","h","{name}","1","7","(256, 1, 1)","(8, 1, 1)","0","9.0",'
            f'"Command line profiler metrics","{metric}","{unit}","{value}"\n')


REPORT = ("==PROF== Connected to process 1\nlatency_ms min=0.1 median=0.1\n" + HEADER +
          row(0, "void kiln::engine::kernels::(anonymous namespace)::layer_norm_kernel<float>"
                 "(const float *, float *, long)", kernel_times.METRIC, "nsecond", "2,048") +
          row(0, "void kiln::engine::kernels::(anonymous namespace)::layer_norm_kernel<float>"
                 "(const float *, float *, long)", "sm__cycles_elapsed.avg", "cycle", "10") +
          row(1, "sm90_xmma_gemm_bf16bf16", kernel_times.METRIC, "usecond", "4.5") +
          row(2, "void kiln::engine::kernels::(anonymous namespace)::layer_norm_kernel<float>"
                 "(const float *, float *, long)", kernel_times.METRIC, "nsecond", "1952") +
          row(3, "sm90_xmma_gemm_bf16bf16", kernel_times.METRIC, "usecond", "5.5"))

# ncu names kernels of an anonymous namespace with "<unnamed>".
NCU_STYLE = HEADER + row(0, "void kiln::<unnamed>::fused_kernel<unsigned int>(float *, long)",
                         kernel_times.METRIC, "nsecond", "800")


def test_rows_take_the_duration_metric_in_nanoseconds_with_short_names():
    rows = kernel_times.kernel_rows(REPORT)
    assert rows == [("layer_norm_kernel<float>", 2048.0), ("sm90_xmma_gemm_bf16bf16", 4500.0),
                    ("layer_norm_kernel<float>", 1952.0), ("sm90_xmma_gemm_bf16bf16", 5500.0)]
    assert kernel_times.kernel_rows("no table here") == []
    assert kernel_times.kernel_rows(NCU_STYLE) == [("fused_kernel<unsigned int>", 800.0)]


def test_summary_is_per_execute_largest_first():
    text = kernel_times.summary("m bf16", kernel_times.kernel_rows(REPORT), iterations=2)
    lines = text.splitlines()
    assert lines[0] == ("=== m bf16: 2 kernels per execute, 7.0 us of kernel time per execute "
                        "(ncu, clocks as set)")
    assert "sm90_xmma_gemm_bf16bf16" in lines[2] and lines[2].split()[0] == "5.0"
    assert "layer_norm_kernel<float>" in lines[3] and lines[3].split()[0] == "2.0"
    assert lines[-1] == ("  in launch order (first execute): layer_norm_kernel=2.0, "
                         "sm90_xmma_gemm_bf16bf16=4.5")


def test_a_program_outside_the_manifest_runs_its_method(monkeypatch, tmp_path):
    """--program PATH:METHOD profiles that method of the program with kiln_runner's default
    inputs, labelled by the file's name and the method."""
    pte = tmp_path / "llm_bf16.pte"
    pte.write_bytes(b"")
    calls = []

    def fake_run(cmd, **kwargs):
        calls.append(cmd)
        Path(cmd[cmd.index("--log-file") + 1]).write_text(REPORT)
        return type("R", (), {"returncode": 0, "stderr": "", "stdout": ""})()

    monkeypatch.setattr(kernel_times.subprocess, "run", fake_run)
    monkeypatch.setattr(kernel_times.shutil, "which", lambda name: sys.executable)
    out = tmp_path / "kernels.txt"
    monkeypatch.setattr(sys, "argv", ["kernel_times.py", "--runner", "kiln_runner", "--program",
                                      f"{pte}:decode", "--out", str(out)])
    assert kernel_times.main() == 0
    assert len(calls) == 1
    cmd = calls[0]
    assert cmd[cmd.index("kiln_runner") + 1] == str(pte.resolve())
    assert cmd[cmd.index("--method") + 1] == "decode"
    assert "--input" not in cmd
    assert out.read_text().startswith("=== llm_bf16 decode: ")


def test_without_keys_or_programs_it_says_what_to_give(monkeypatch, capsys):
    monkeypatch.setattr(sys, "argv", ["kernel_times.py", "--runner", "r", "--out", "x"])
    with pytest.raises(SystemExit) as e:
        kernel_times.main()
    assert e.value.code == 2
    assert "give --keys (with --models) or --program" in capsys.readouterr().err
