"""One line a profiled kernel from `ncu --csv --page details` (LaunchStats and Occupancy sections): grid, block,
registers, theoretical occupancy and waves per SM, in launch order (scripts/probe-waves.py prints the rows)."""
import csv
import sys

WANT = ("Grid Size", "Block Size", "Registers Per Thread", "Theoretical Occupancy", "Waves Per SM",
        "Block Limit Registers", "Block Limit Shared Mem")
kernels: dict[str, dict] = {}
for r in csv.DictReader(line for line in open(sys.argv[1]) if line.startswith('"')):
    k = kernels.setdefault(r["ID"], {"name": r["Kernel Name"].split("(")[0].split("<")[0]})
    if r["Metric Name"] in WANT:
        k[r["Metric Name"]] = r["Metric Value"]
print("kernel | " + " | ".join(WANT))
for k in kernels.values():
    print(k["name"], "|", " | ".join(k.get(w, "-") for w in WANT))
