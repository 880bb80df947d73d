"""Converts fio's JSON output (on stdin, possibly preceded by log lines) into the
one-line result format of nbd_bench, for bench/nbd/run.sh."""
import json
import sys

workload, qd = sys.argv[1], int(sys.argv[2])
text = sys.stdin.read()
j = json.loads(text[text.index("{"):])["jobs"][0]
side = j["read"] if workload.endswith("read") else j["write"]
pct = side["clat_ns"].get("percentile", {})
print(json.dumps({
    "workload": workload, "bs": 4096, "qd": qd, "conns": 1, "fua": False,
    "seconds": j["elapsed"], "ops": side["total_ios"], "iops": round(side["iops"], 1),
    "mib_s": round(side["bw"] / 1024, 2),
    "lat_us_p50": int(pct.get("50.000000", 0) / 1000),
    "lat_us_p99": int(pct.get("99.000000", 0) / 1000),
    "lat_us_max": int(side["clat_ns"]["max"] / 1000),
}, separators=(",", ":")))
