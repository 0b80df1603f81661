"""Export side of the device-resident end-to-end check: examples/device_resident/export.py into
--out (device_resident.pte, default.pte, inputs, eager outputs), with its checks of the saved files
(no et_copy and CUDA method I/O in the device-resident program; both copies in the default one)."""

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "examples" / "device_resident"))
import export as device_resident_export  # noqa: E402

if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True)
    device_resident_export.main(ap.parse_args().out)
