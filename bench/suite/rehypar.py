"""Experiment 16 (rehypar): ReHypar's measured claim, seed 003 section 4, scaled.

The paper measured write throughput: IOzone 10-14% over ext2 and 11% over ext4 on the
SSD, Postmark 12% for 256 KiB over 64 KiB extents, and credits it to "the large I/O
granularity": small files are packed into extents held in memory, each written once it is
full or its time in memory expires. `dhrd-bench rehypar-io` measures exactly that on a
device file on the disk under test: Postmark's small files (500 B to 10 KB), each
durable before its writer goes on, placed by ReHypar (the paper's sections, v = 8) and
written as whole extents, against first-fit placement with one synchronous write per file;
and, to tell where a difference comes from, first-fit with a sync shared by the writers
that wrote meanwhile (group commit). No file is deleted. The claim's targets: throughput
>= 1.10x first-fit, at >= 0.85x first-fit's space utilisation. Run with one writer and with
many (`rehypar_threads`): a synchronous writer alone makes every extent wait out its window
holding one file.
"""

import json
import os

import lib
from lib import log, run

PAPER = "seed 003 Fig. 3-6"
TITLE = "16. ReHypar: small synchronous file writes packed into extents vs first-fit (seed 003)"
THROUGHPUT_TARGET = 1.10
UTILISATION_TARGET = 0.85


def exp_rehypar(ctx):
    p = ctx.p
    dev = os.path.join(ctx.ws.disk, "rehypar-device.img")
    rows, ratios, runs = [], [], {}
    for threads in p["rehypar_threads"]:
        log(f"[16 rehypar] {threads} writer(s): start")
        out = run([ctx.ws.dhrd_bench, "rehypar-io", "--file", dev, "--device-mib", str(p["rehypar_device_mib"]),
                   "--files", str(p["rehypar_files"]), "--threads", str(threads), "--rounds", str(p["rehypar_rounds"]),
                   "--window-ms", str(p["rehypar_window_ms"])], timeout=7200)
        d = json.loads(out[out.index("{"):])
        runs[threads] = d
        for m in d["medians"]:
            oos = [r for r in d["runs"] if r["config"] == m["config"] and r.get("out_of_space")]
            rows.append(dict(threads=threads, **m,
                             out_of_space=f"{len(oos)} of {p['rehypar_rounds']} runs" if oos else ""))
            log(f"[16 rehypar] {threads} writer(s) {m['config']}: {m['files_per_sec']:.0f} files/s, "
                f"utilisation {m['utilisation']:.3f}")
        what = f"{threads} writer(s), window {p['rehypar_window_ms']} ms"
        ratios.append({"what": f"{what}: files written durably per second", "figure": "rehypar",
                       "baseline": "first-fit", "value": d["throughput_ratio"], "kind": "as the paper measured",
                       "target": f">= {THROUGHPUT_TARGET:g}x", "paper": PAPER})
        ratios.append({"what": f"{what}: space utilisation, no deletes", "figure": "rehypar",
                       "baseline": "first-fit", "value": d["utilisation_ratio"], "kind": "as the paper measured",
                       "target": f">= {UTILISATION_TARGET:g}x", "paper": PAPER})
        med = {m["config"]: m for m in d["medians"]}
        g, r = med.get("first-fit-groupcommit"), med.get("rehypar")
        if g and r and g["files_per_sec"]:
            ratios.append({"what": f"{what}: files per second, against first-fit with a shared sync",
                           "figure": "rehypar", "baseline": "first-fit-groupcommit",
                           "value": round(r["files_per_sec"] / g["files_per_sec"], 3),
                           "kind": "our own comparison"})
    return {
        "title": TITLE,
        "paper": PAPER,
        "scaling": f"a {p['rehypar_device_mib']} MiB device file on the disk under test, {p['rehypar_files']} "
                   f"Postmark-sized files per run, writers {p['rehypar_threads']}, {p['rehypar_rounds']} round(s) "
                   f"alternating the order, window {p['rehypar_window_ms']} ms (the paper gives none)",
        "rows": rows,
        "ratios": ratios,
        "runs": runs,
        "notes": [
            "Every file is durable before its writer goes on: first-fit writes it with pwritev2(RWF_DSYNC); "
            "rehypar copies it into its extent's buffer and waits until the extent is written with one "
            "synchronous write (when ReHypar no longer offers it: full, or its window in memory expired). "
            "Every file is read back and checked after each run.",
            "utilisation = bytes of the files / bytes the allocator holds at the end (1 KiB blocks: first-fit "
            "loses only the rounding to whole blocks; ReHypar also the rest of each leaf chunk and the remainder "
            "of every extent written before it was full).",
            "out_of_space: ReHypar ran out of room before the last file (the files written are counted).",
        ],
    }
