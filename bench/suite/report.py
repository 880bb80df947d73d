"""report.md and the PNG plots from results.json.

Can be run alone to redraw a committed run: /usr/bin/python3 bench/suite/report.py DIR
"""

import json
import os
import sys

import report_figures
from report_labels import kind_of, reproduces


def fmt(v):
    if isinstance(v, bool):
        return "yes" if v else "no"
    if isinstance(v, float):
        if v == 0:
            return "0"
        a = abs(v)
        if a >= 100:
            return f"{v:,.0f}"
        if a >= 10:
            return f"{v:.1f}"
        if a >= 1:
            return f"{v:.2f}"
        return f"{v:.3g}"
    if isinstance(v, int):
        return f"{v:,}" if abs(v) >= 10000 else str(v)
    return "" if v is None else str(v)


def table(rows, cols):
    out = ["| " + " | ".join(c for c, _ in cols) + " |", "|" + "---|" * len(cols)]
    for r in rows:
        out.append("| " + " | ".join(fmt(r.get(k)) for _, k in cols) + " |")
    return "\n".join(out)


def pivot(rows, row_keys, col_key, val_key):
    """One line per distinct row_keys tuple, one column per col_key value."""
    cols = sorted({r[col_key] for r in rows if col_key in r})
    lines = {}
    for r in rows:
        k = tuple(r.get(x) for x in row_keys)
        lines.setdefault(k, {})[r.get(col_key)] = r.get(val_key)
    head = "| " + " | ".join(row_keys) + " | " + " | ".join(f"{col_key}={c}" for c in cols) + " |"
    out = [head, "|" + "---|" * (len(row_keys) + len(cols))]
    for k, vals in lines.items():
        out.append("| " + " | ".join(fmt(x) for x in k) + " | " + " | ".join(fmt(vals.get(c)) for c in cols) + " |")
    return "\n".join(out)


# Columns of each experiment's main table: (heading, key).
COLUMNS = {
    "attach": [("what", "what"), ("config", "config"), ("procs", "procs"), ("bytes", "bytes"), ("s", "secs"),
               ("first read s", "first_read_s"), ("RAM/byte", "ram_per_data_byte"), ("IOPS", "iops"),
               ("extract s", "extract_s"), ("re-read s", "reread_s"), ("SQLite commits/s", "sqlite_commits_per_s"),
               ("failed calls", "failed_calls"), ("hung", "hung_calls"), ("lost writes", "acknowledged_writes_lost")],
    "apps": [("workload", "workload"), ("config", "config"), ("round", "round"), ("s", "secs"), ("rate", "rate"),
             ("per", "rate_unit"), ("daemon CPU s", "daemon_cpu_s"),
             ("daemon CPU us per file", "daemon_cpu_us_per_file"), ("skipped", "skipped")],
    "replay": [("config", "config"), ("trace", "trace"), ("QD", "qd"), ("IOPS", "iops"), ("MiB/s", "mib_s"),
               ("read p50 us", "read_lat_p50_us"), ("read p99 us", "read_lat_p99_us"),
               ("write p50 us", "write_lat_p50_us"), ("write p99 us", "write_lat_p99_us"),
               ("late p99 us", "late_p99_us"), ("verified", "verify_ok"), ("writes durable", "durable")],
    "file": [("config", "config"), ("workload", "workload"), ("IOPS", "iops"), ("MiB/s", "mib_s"),
             ("read mean us", "read_lat_mean_us"), ("read p99 us", "read_lat_p99_us"),
             ("write mean us", "write_lat_mean_us"), ("write p99 us", "write_lat_p99_us"),
             ("fsync mean us", "sync_lat_mean_us"), ("writes durable", "durable")],
    "video": [("config", "config"), ("repeat", "repeat"), ("total s", "total_secs"), ("read s", "read_secs"), ("write s", "write_secs"),
              ("MiB/s", "mib_per_sec"), ("copy back s", "copy_back_s"), ("total with copy back s", "total_with_copy_back_s"),
              ("writes durable", "durable")],
    "warmup": [("config", "config"), ("data", "size"), ("mount to first read ms", "mount_to_first_read_ms"),
               ("full load s", "full_load_s"), ("reads during load IOPS", "during_read_iops"),
               ("p50 us", "during_read_p50_us"), ("p99 us", "during_read_p99_us"),
               ("after load IOPS", "after_read_iops"), ("p50 us ", "after_read_p50_us"),
               ("p99 us ", "after_read_p99_us"), ("remount after SIGKILL: warm s", "remount_warm_s"),
               ("disk read share", "remount_disk_read_fraction")],
    "blockfs": [("config", "config"), ("file system", "fs"), ("mode", "mode"), ("files", "files"),
                ("ops/s", "ops_per_sec"), ("read MiB/s", "read_mib_per_sec"), ("write MiB/s", "write_mib_per_sec"),
                ("a file is durable", "durable"), ("not available", "not_available"), ("failed", "error")],
    "rehypar": [("writers", "threads"), ("config", "config"), ("files/s", "files_per_sec"),
                ("utilisation", "utilisation"), ("bytes per device write", "bytes_per_device_write"),
                ("mean us per file", "latency_mean_us"), ("out of space", "out_of_space")],
    "rbd": [("config", "config"), ("op", "op"), ("QD", "qd"), ("IOPS", "iops"), ("mean us", "lat_mean_us"),
            ("MiB/s", "mib_s")],
    "cache": [("config", "config"), ("workload", "workload"), ("IOPS", "iops"), ("hit ratio", "hit_ratio"),
              ("mean us", "lat_mean_us"), ("MiB/s", "mib_s")],
    "seed002": [("config", "config"), ("workload", "workload"), ("files", "files"), ("read MiB/s", "mib_s"),
                ("read s", "secs"), ("write MiB/s", "write_mib_s"), ("pgbench scale", "scale"), ("TPS", "tps"),
                ("mean latency ms", "lat_mean_ms"), ("init s", "init_secs")],
    "nvm": [("device", "device"), ("part", "part"), ("workload", "workload"), ("setting", "setting"),
            ("IOPS", "iops"), ("MiB/s", "mib_s"), ("mean us", "lat_mean_us"), ("cached after", "cached_after")],
    "tier": [("trace", "trace"), ("cache tier", "level"), ("QD", "qd"), ("durability", "durability"),
             ("config", "config"), ("IOPS", "iops"), ("mean us", "mean_us"), ("hit share (counters)", "hit_share"),
             ("hit share (< 7.5 ms)", "hit_share_by_latency"), ("t_hit us", "t_hit_us"),
             ("t_hit read us", "t_hit_read_us"), ("t_miss us", "t_miss_us"), ("read p50 us", "read_p50_us"),
             ("read p99 us", "read_p99_us"), ("write p50 us", "write_p50_us"), ("write p99 us", "write_p99_us"),
             ("written back MiB", "written_back_mib"), ("RAM hit ratio", "ram_hit_ratio")],
    "memory": [("config", "config"), ("data bytes", "data_bytes"), ("RAM bytes", "ram_bytes"),
               ("RAM per data byte", "ram_per_data_byte"), ("writes durable", "durable")],
}


# The applications experiment's medians per configuration (bench/suite/apps.py, summary_of).
APPS_SUMMARY = [("config", "config"), ("extract s", "extract_s"), ("re-read s", "reread_s"),
                ("SQLite commits/s", "sqlite_commits_per_s"), ("pgbench rw TPS", "pgbench_rw_tps"),
                ("pgbench select TPS", "pgbench_ro_tps"), ("git clone s", "git_clone_s"),
                ("git status s", "git_status_s"), ("daemon CPU us per file, extract", "extract_cpu_us_per_file"),
                ("daemon CPU us per file, re-read", "reread_cpu_us_per_file"), ("daemon CPU s, whole run", "run_cpu_s")]


def main_table(name, e):
    rows = e.get("rows", [])
    if not rows:
        return ""
    if name == "block":
        return ("IOPS by number of processes:\n\n"
                + pivot(rows, ["config", "mode", "op", "durable"], "procs", "iops")
                + "\n\nMean latency (us) by number of processes:\n\n"
                + pivot([dict(r, lat=r.get("read_lat_mean_us") or r.get("write_lat_mean_us")) for r in rows],
                        ["config", "mode", "op"], "procs", "lat"))
    if name == "apps":
        return ("Medians over the rounds (daemon CPU per file: the daemon's utime + stime over the files):\n\n"
                + table(e.get("summary", []), APPS_SUMMARY)
                + "\n\nEvery run, round by round:\n\n" + table(rows, COLUMNS["apps"]))
    if name == "fileserver":
        fsr = [r for r in rows if r.get("workload", "fileserver") == "fileserver"]
        meta = [r for r in rows if r.get("workload") == "metaops"]
        pm = [r for r in rows if r.get("workload") == "postmark"]
        out = ("Fileserver operations per second by file count:\n\n"
               + pivot(fsr, ["config", "durable"], "files", "ops_per_sec")
               + "\n\nMean latency (us) of each fileserver flowop, by file count:\n\n"
               + flowop_table(fsr))
        if meta:
            out += ("\n\nEmpty files created, stat'ed and unlinked (ops/s over the three phases, and per phase):\n\n"
                    + table(meta, [("config", "config"), ("threads", "threads"), ("ops/s", "ops_per_sec"),
                                   ("create/s", "create_per_sec"), ("stat/s", "stat_per_sec"),
                                   ("unlink/s", "unlink_per_sec"), ("durable", "durable")]))
        if pm:
            out += ("\n\nPostmark:\n\n"
                    + table(pm, [("config", "config"), ("transactions/s", "tx_per_sec"),
                                 ("transaction phase s", "tx_secs"), ("whole run s", "total_secs"),
                                 ("durable", "durable")]))
        return out
    return table(rows, COLUMNS.get(name, [(k, k) for k in rows[0] if not isinstance(rows[0][k], (dict, list))]))


def flowop_table(rows):
    ops = []
    for r in rows:
        for k in (r.get("flowops") or {}):
            if k not in ops:
                ops.append(k)
    cols = [("config", "config"), ("files", "files")] + [(o, o) for o in ops]
    flat = []
    for r in rows:
        f = {"config": r["config"], "files": r["files"]}
        for o, v in (r.get("flowops") or {}).items():
            f[o] = v.get("mean_us") if isinstance(v, dict) else v
        flat.append(f)
    return table(flat, cols)


def write(results, out):
    m = results["machine"]
    lines = [
        f"# dhrd benchmark suite: profile `{results['profile']}`",
        "",
        f"Run {m['date']} on {m['host']}: {m['cpu']}, {m['cores']} cores, {m['ram_bytes'] / (1 << 30):.1f} GiB RAM, "
        f"kernel {m['kernel']}; disk under test {m['disk_dir']} ({m['disk_dir_fs']}; {m['disks']}); "
        f"{m['fio']}; {m['rustc']}; dhrd {m['dhrd_commit']}{' (uncommitted changes)' if m.get('dhrd_dirty') else ''}"
        + (f", binary {results['dhrd_binary']}" if results.get("dhrd_binary") else "") + ".",
        "",
        "Idle CPUs and freed RAM: " + (", ".join(f"{k} {v}" for k, v in m.get("idle", {}).items()) or "not known") + ".",
        "",
        f"Command: `{results['command']}`; {results.get('seconds', '?')} s in all.",
        "",
    ]
    if results.get("overrides"):
        lines += ["Parameters changed from the profile's (`--set`): "
                  + ", ".join(f"`{k}={v!r}`" for k, v in results["overrides"].items()) + ".", ""]
    lines += [
        "Every ratio below divides two figures measured in this run, on this machine (shared and noisy: "
        "absolute numbers from different runs are not comparable). Configurations are described in "
        "`docs/benchmarks.md`; 'writes durable' says when a completed write survives a crash.",
        "",
    ]
    lines += ["Which paper figure each experiment reproduces, and whether its figures are measured as the paper "
              "measured them or are our own comparison (`bench/suite/report_labels.py`):", "",
              "| experiment | reproduces | measured |", "|---|---|---|"]
    for name in results["experiments"]:
        fig, how = reproduces(name)
        lines.append(f"| {name} | {fig} | {how} |")
    lines.append("")
    summary = []
    for name, e in results["experiments"].items():
        lines.append(f"## {e.get('title', name)}")
        lines.append("")
        fig, how = reproduces(name)
        lines += [f"Reproduces: {fig}. Measured: {how}.", ""]
        if e.get("error"):
            lines += [f"**Failed:** {e['error']}", ""]
            continue
        if e.get("skipped"):
            lines += [f"Skipped: {e['skipped']}", ""]
            continue
        lines += [f"Scaling: {e.get('scaling', '')}. Took {e.get('seconds', '?')} s.", ""]
        if e.get("ratios"):
            lines += ["| ratio | figure | baseline | value | measured | target |", "|---|---|---|---|---|---|"]
            for r in e["ratios"]:
                # A ratio unless it names its unit (seconds, counts).
                unit = r.get("unit", "x")
                value = "not measured" if r["value"] is None else f"{fmt(r['value'])}{unit}"
                lines.append(f"| {r['what']} | {r['figure']} | {r['baseline']} | {value} | "
                             f"{kind_of(name, r)} | {r.get('target', '')} |")
                summary.append((name, r))
            lines.append("")
        lines += [main_table(name, e), ""]
        for n in e.get("notes", []):
            lines.append(f"- {n}")
        png = plot(name, e, out)
        if png:
            lines += ["", f"![{name}]({png})"]
        lines.append("")
    with open(os.path.join(out, "report.md"), "w") as f:
        f.write("\n".join(lines))


def plot(name, e, out):
    """One PNG per experiment; None where matplotlib is missing or nothing was measured."""
    rows = e.get("rows") or []
    if not rows:
        return None
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("report: matplotlib not importable here (use /usr/bin/python3); no plots", file=sys.stderr)
        return None
    fn = f"{name}.png"
    if name == "block":
        fig, axes = plt.subplots(1, 2, figsize=(13, 5))
        for ax, op in zip(axes, ("randread", "randwrite")):
            series = {}
            for r in rows:
                if r["op"] == op:
                    series.setdefault(f"{r['config']} ({r['mode']})", []).append((r["procs"], r["iops"]))
            for lab, pts in series.items():
                pts.sort()
                ax.plot([x for x, _ in pts], [y for _, y in pts], marker="o", label=lab)
            ax.set_xscale("log", base=2)
            ax.set_yscale("log")
            ax.set_xlabel("processes")
            ax.set_ylabel("IOPS (4 KiB)")
            ax.set_title(f"block level, random {op[4:]}")
            ax.grid(True, which="both", alpha=0.3)
            ax.legend(fontsize=7)
    elif name in ("file", "replay"):
        def key(r):
            return r["workload"] if name == "file" else f"{r['trace']} qd{r['qd']}"

        groups = list(dict.fromkeys(key(r) for r in rows))
        cfgs = list(dict.fromkeys(r["config"] for r in rows))
        fig, ax = plt.subplots(figsize=(max(8, len(groups) * len(cfgs) * 0.35), 5))
        w = 0.8 / max(1, len(cfgs))
        for i, c in enumerate(cfgs):
            ys = []
            for g in groups:
                v = next((r for r in rows if r["config"] == c and key(r) == g), None)
                ys.append((v.get("mib_s") if name == "file" and g.startswith("seq") else v.get("iops")) if v else 0)
            ax.bar([j + i * w for j in range(len(groups))], ys, w, label=c)
        ax.set_xticks([j + 0.4 - w / 2 for j in range(len(groups))])
        ax.set_xticklabels([g + (" (MiB/s)" if g.startswith("seq") else "") for g in groups], fontsize=8)
        ax.set_yscale("log")
        ax.set_ylabel("IOPS (seq: MiB/s)")
        ax.set_title("file level" if name == "file" else "trace replay")
        ax.legend(fontsize=7)
        ax.grid(True, axis="y", which="both", alpha=0.3)
    elif name == "fileserver":
        fig, ax = plt.subplots(figsize=(8, 5))
        fsr = [r for r in rows if r.get("workload", "fileserver") == "fileserver"]
        for c in dict.fromkeys(r["config"] for r in fsr):
            pts = sorted((r["files"], r.get("ops_per_sec", 0)) for r in fsr if r["config"] == c)
            ax.plot([x for x, _ in pts], [y for _, y in pts], marker="o", label=c)
        ax.set_xscale("log")
        ax.set_xlabel("files")
        ax.set_ylabel("ops/s")
        ax.set_title("fileserver")
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=8)
    elif name == "video":
        fig, ax = plt.subplots(figsize=(8, 5))
        # The median repeat of each configuration (rows carry one per repeat).
        cfgs = list(dict.fromkeys(r["config"] for r in rows))
        med = {c: sorted((r for r in rows if r["config"] == c), key=lambda r: r.get("total_secs", 0)) for c in cfgs}
        med = {c: v[len(v) // 2] for c, v in med.items()}
        ax.bar(cfgs, [med[c].get("total_secs", 0) for c in cfgs], label="read, modify, save x rounds (median repeat)")
        ax.bar(cfgs, [med[c].get("copy_back_s", 0) for c in cfgs], bottom=[med[c].get("total_secs", 0) for c in cfgs],
               label="copy back (log2ram)")
        ax.set_ylabel("seconds (lower is better)")
        ax.set_title("video editing")
        ax.legend(fontsize=8)
        plt.setp(ax.get_xticklabels(), rotation=20, fontsize=8)
    elif name == "warmup":
        fig, axes = plt.subplots(1, 2, figsize=(13, 5))
        for c in dict.fromkeys(r["config"] for r in rows):
            pts = sorted((r["bytes"] / (1 << 30), r.get("full_load_s")) for r in rows if r["config"] == c)
            axes[0].plot([x for x, _ in pts], [y for _, y in pts], marker="o", label=c)
            pts = sorted((r["bytes"] / (1 << 30), r.get("mount_to_first_read_ms")) for r in rows
                         if r["config"] == c and r.get("mount_to_first_read_ms") is not None)
            if pts:
                axes[1].plot([x for x, _ in pts], [y for _, y in pts], marker="o", label=c)
        axes[0].set_title("time until all data is in RAM")
        axes[0].set_ylabel("seconds")
        axes[1].set_title("time until the first read is answered")
        axes[1].set_ylabel("ms")
        axes[1].set_yscale("log")
        for ax in axes:
            ax.set_xlabel("data (GiB)")
            ax.grid(True, which="both", alpha=0.3)
            ax.legend(fontsize=8)
    elif name == "memory":
        fig, ax = plt.subplots(figsize=(8, 5))
        ax.bar([r["config"] for r in rows], [r["ram_per_data_byte"] for r in rows])
        ax.axhline(1.0, color="k", lw=0.8)
        ax.set_ylabel("bytes of RAM per byte of data")
        ax.set_title("memory after the data was read once")
        plt.setp(ax.get_xticklabels(), rotation=20, fontsize=8)
    elif name == "rbd":
        fig, axes = plt.subplots(1, 2, figsize=(13, 5))
        ops = [(r["op"], r["qd"]) for r in rows if r["config"] == "fio-rbd" and "iops" in r]
        labels = [f"{op} QD{qd}" for op, qd in ops]
        w = 0.4
        for i, c in enumerate(("fio-rbd", "dhrd-nbd-rbd")):
            ys = [next((r["iops"] for r in rows if r["config"] == c and (r["op"], r["qd"]) == k), 0) for k in ops]
            axes[0].bar([j + i * w for j in range(len(ops))], ys, w, label=c)
        axes[0].set_xticks([j + w / 2 for j in range(len(ops))])
        axes[0].set_xticklabels(labels, fontsize=8)
        axes[0].set_yscale("log")
        axes[0].set_ylabel("IOPS (4 KiB)")
        axes[0].set_title("4 KiB random I/O: dhrd on RBD vs librbd")
        axes[0].legend(fontsize=8)
        loads = e.get("loads", [])
        for size in sorted({x["image_bytes"] for x in loads}):
            pts = [x["first_read_ms"] for x in loads if x["image_bytes"] == size]
            axes[1].scatter([size / (1 << 30)] * len(pts), pts, label=f"{size / (1 << 30):.2f} GiB")
        axes[1].axhline(100, color="k", lw=0.8, ls="--", label="target 100 ms")
        axes[1].set_ylim(bottom=0)
        axes[1].set_xlabel("image (GiB)")
        axes[1].set_ylabel("ms")
        axes[1].set_title("start to first read answered")
        axes[1].legend(fontsize=8)
        for ax in axes:
            ax.grid(True, which="both", alpha=0.3)
    elif name == "cache":
        fig, axes = plt.subplots(1, 2, figsize=(13, 5))
        zr = [r for r in rows if "hit_ratio" in r]
        labels = [f"{r['config']}\n{r['workload']}" for r in zr]
        axes[0].bar(range(len(zr)), [r["iops"] for r in zr])
        for i, r in enumerate(zr):
            axes[0].annotate(f"hit {r['hit_ratio']:.2f}", (i, r["iops"]), ha="center", va="bottom", fontsize=7)
        axes[0].set_xticks(range(len(zr)))
        axes[0].set_xticklabels(labels, fontsize=6, rotation=20)
        axes[0].set_yscale("log")
        axes[0].set_ylabel("IOPS (4 KiB, QD8)")
        axes[0].set_title("zipf(1.2), RAM = 1/4 of the export, 2 ms backing")
        ra = [r for r in rows if r["workload"].startswith("HDD: sequential")]
        rr = [r for r in rows if r["workload"].startswith("HDD: random")]
        w = 0.4
        axes[1].bar([i for i in range(len(ra))], [r["mib_s"] for r in ra], w, label="sequential MiB/s")
        axes[1].bar([i + w for i in range(len(rr))], [r["iops"] * 4096 / (1 << 20) for r in rr], w,
                    label="random MiB/s")
        axes[1].set_xticks([i + w / 2 for i in range(len(ra))])
        axes[1].set_xticklabels([r["config"] for r in ra], fontsize=8)
        axes[1].set_ylabel("MiB/s (4 KiB reads, QD1)")
        axes[1].set_title("read-ahead over the HDD profile")
        axes[1].legend(fontsize=8)
        for ax in axes:
            ax.grid(True, which="both", alpha=0.3)
    elif name == "seed002":
        fig, axes = plt.subplots(1, 2, figsize=(13, 5))
        cfgs = list(dict.fromkeys(r["config"] for r in rows))
        dr = [r for r in rows if r.get("workload") == "dfsio-read"]
        counts = sorted({r["files"] for r in dr})
        w = 0.8 / max(1, len(cfgs))
        for i, c in enumerate(cfgs):
            ys = [next((r["mib_s"] for r in dr if r["config"] == c and r["files"] == n), 0) for n in counts]
            axes[0].bar([j + i * w for j in range(len(counts))], ys, w, label=c)
        axes[0].set_xticks([j + 0.4 - w / 2 for j in range(len(counts))])
        fsz = dr[0]["file_bytes"] / (1 << 20) if dr else 0
        axes[0].set_xticklabels([f"{n} x {fsz:.0f} MiB" for n in counts])
        axes[0].set_yscale("log")
        axes[0].set_ylabel("read MiB/s (all files, in parallel)")
        axes[0].set_title("TestDFSIO-like read after a cache drop, HDD profile")
        axes[0].legend(fontsize=8)
        pg = [r for r in rows if r.get("workload") == "pgbench"]
        axes[1].bar([r["config"] for r in pg], [r["tps"] for r in pg], color=[f"C{cfgs.index(r['config'])}" for r in pg])
        axes[1].set_ylabel("transactions per second")
        axes[1].set_title(f"pgbench -c 4 (scale {pg[0]['scale'] if pg else '?'}), cold cache, HDD profile")
        for ax in axes:
            ax.grid(True, axis="y", which="both", alpha=0.3)
    elif name == "nvm":
        fig = plot_nvm(plt, rows)
    elif name in report_figures.PLOTS:
        fig = report_figures.PLOTS[name](plt, rows, e)
    else:
        return None
    fig.tight_layout()
    fig.savefig(os.path.join(out, fn), dpi=110)
    plt.close(fig)
    return fn


def plot_nvm(plt, rows):
    """Experiment 11: one panel per figure of seed 004, one series (or bar group) per device."""
    devices = list(dict.fromkeys(r["device"] for r in rows))
    fig, axes = plt.subplots(2, 3, figsize=(17, 9))
    w = 0.8 / max(1, len(devices))

    def bars(ax, part, keyf, val, title, ylabel):
        sel = [r for r in rows if r["part"] == part]
        groups = list(dict.fromkeys(keyf(r) for r in sel))
        for i, d in enumerate(devices):
            ys = [next((r[val] for r in sel if r["device"] == d and keyf(r) == g), 0) for g in groups]
            ax.bar([j + i * w for j in range(len(groups))], ys, w, label=d)
        ax.set_xticks([j + 0.4 - w / 2 for j in range(len(groups))])
        ax.set_xticklabels(groups, fontsize=6, rotation=35, ha="right")
        ax.set_yscale("log")
        ax.set_ylabel(ylabel)
        ax.set_title(title, fontsize=9)
        if ax.get_legend_handles_labels()[0]:
            ax.legend(fontsize=7)

    def lines(ax, part, workload, xkey, val, title, xlabel, ylabel, logx=True):
        for d in devices:
            pts = sorted((r[xkey], r[val]) for r in rows
                         if r["device"] == d and r["part"] == part and r["workload"] == workload and xkey in r)
            if pts:
                ax.plot([max(x, 1e-9) if not logx else max(x, 1) for x, _ in pts], [y for _, y in pts],
                        marker="o", label=d)
        if logx:
            ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xlabel(xlabel)
        ax.set_ylabel(ylabel)
        ax.set_title(title, fontsize=9)
        if ax.get_legend_handles_labels()[0]:
            ax.legend(fontsize=7)

    bars(axes[0][0], "mode", lambda r: f"{r['workload']} {r['setting']}", "iops",
         "Fig. 2/4: 4 KiB psync by I/O mode (buffered writes: with the final fsync)", "IOPS")
    lines(axes[0][1], "kernel read-ahead", "read 4K buffered (cold)", "ra_sectors", "mib_s",
          "Fig. 5: sequential 4 KiB reads vs kernel read-ahead", "blockdev --setra (sectors; 0 plotted at 1)",
          "MiB/s")
    lines(axes[0][2], "request size", "randread O_DIRECT", "bs", "mib_s",
          "Fig. 6: O_DIRECT random reads, same bytes in fewer, larger requests", "request size (bytes)", "MiB/s")
    lines(axes[1][0], "request size", "randread O_DIRECT", "bs", "lat_mean_us",
          "Fig. 7: time of one O_DIRECT random read by its size", "request size (bytes)", "mean latency (us)")
    lines(axes[1][1], "memory size", "zipf(1.2) randread 4K QD1", "mem_fraction", "iops",
          "Fig. 3: zipf(1.2) reads vs dhrd RAM (share of the export)", "RAM / export", "IOPS", logx=False)
    bars(axes[1][2], "dhrd read-ahead", lambda r: f"{r['workload'].split(' QD')[0]} {r['setting']}", "iops",
         "dhrd read-ahead, RAM 1/4 of the export, no prefill", "IOPS (4 KiB, QD1)")
    for row in axes:
        for ax in row:
            ax.grid(True, which="both", alpha=0.3)
    return fig


if __name__ == "__main__":
    d = sys.argv[1]
    with open(os.path.join(d, "results.json")) as f:
        write(json.load(f), d)
    print(f"wrote {d}/report.md")
