"""The plots of the experiments that reproduce one paper figure each: the tiered device
(seed 000 Fig. 11), the fileserver on the block device (Fig. 9) and ReHypar's writes
(seed 003); and of the small-file applications (issue 33). Each takes matplotlib's pyplot,
the experiment's rows and its whole result, and returns a figure; `report.plot` saves it.
"""


def bars(ax, groups, series, value, label, log=True):
    """Grouped bars: one group per key in `groups`, one bar per series name; `value(g, s)`
    gives the height (None: no bar)."""
    w = 0.8 / max(1, len(series))
    for i, sname in enumerate(series):
        ys = [value(g, sname) or 0 for g in groups]
        ax.bar([j + i * w for j in range(len(groups))], ys, w, label=sname)
    ax.set_xticks([j + 0.4 - w / 2 for j in range(len(groups))])
    if log and any(value(g, sname) for g in groups for sname in series):
        ax.set_yscale("log")
    ax.set_ylabel(label)
    ax.grid(True, axis="y", which="both", alpha=0.3)
    ax.legend(fontsize=7)


def plot_tier(plt, rows, e):
    """IOPS by configuration and the hits' read service time, one group per trace, level,
    queue depth and durability."""
    cfgs = list(dict.fromkeys(r["config"] for r in rows))
    groups = list(dict.fromkeys((r["trace"], r["level"], r["qd"], r.get("durability", "sync")) for r in rows))

    def get(key):
        return lambda g, c: next((r.get(key) for r in rows if (r["trace"], r["level"], r["qd"],
                                                                 r.get("durability", "sync")) == g
                                  and r["config"] == c), None)

    fig, axes = plt.subplots(1, 2, figsize=(14, 5))
    bars(axes[0], groups, cfgs, get("iops"), "IOPS (trace replay)")
    tiered = [c for c in cfgs if c in ("dhrd-tier", "ssd-tier")]
    bars(axes[1], groups, tiered, get("t_hit_read_us"), "read service time of a hit (us)")
    for ax in axes:
        ax.set_xticklabels([f"{t}\n{lv} QD{qd}\n{d}" for t, lv, qd, d in groups], fontsize=7)
    axes[0].set_title("replayed: HDD-timed lower tier, cache tier at 70% / 80%")
    axes[1].set_title("what the paper's estimate rests on: the hits' service time")
    return fig


def plot_blockfs(plt, rows, e):
    """Fileserver operations per second by configuration, per file count and sync mode."""
    ok = [r for r in rows if r.get("ops_per_sec")]
    cfgs = list(dict.fromkeys(r["config"] for r in ok))
    groups = list(dict.fromkeys((r["files"], r["mode"]) for r in ok))
    fig, ax = plt.subplots(figsize=(max(8, len(groups) * len(cfgs) * 0.5), 5))
    bars(ax, groups, cfgs, lambda g, c: next((r["ops_per_sec"] for r in ok if (r["files"], r["mode"]) == g
                                               and r["config"] == c), None), "fileserver ops/s")
    ax.set_xticklabels([f"{n} files\n{m}" for n, m in groups], fontsize=8)
    ax.set_title("Filebench fileserver on a file system over each configuration (seed 000 Fig. 9)")
    return fig


def plot_rehypar(plt, rows, e):
    """Throughput and utilisation of ReHypar against first-fit, per number of writers."""
    cfgs = list(dict.fromkeys(r["config"] for r in rows))
    groups = list(dict.fromkeys(r["threads"] for r in rows))

    def get(key):
        return lambda g, c: next((r.get(key) for r in rows if r["threads"] == g and r["config"] == c), None)

    fig, axes = plt.subplots(1, 2, figsize=(12, 5))
    bars(axes[0], groups, cfgs, get("files_per_sec"), "files written durably per second")
    bars(axes[1], groups, cfgs, get("utilisation"), "live bytes / held bytes (no deletes)", log=False)
    for ax in axes:
        ax.set_xticklabels([f"{g} writer(s)" for g in groups], fontsize=8)
    axes[0].set_title("small synchronous file writes into an SSD file (seed 003)")
    axes[1].set_title("space utilisation")
    return fig


# Short names of the applications experiment's figures (bench/suite/apps.py, FIGURES).
APPS_LABELS = {"extract_s": "extract", "reread_s": "re-read warm", "sqlite_commits_per_s": "SQLite commits",
               "pgbench_rw_tps": "pgbench rw", "pgbench_ro_tps": "pgbench select", "git_clone_s": "git clone",
               "git_status_s": "git status"}


def plot_apps(plt, rows, e):
    """Each application's same-run ratio against the plain directory (higher is better),
    with its target, and the daemon's CPU per file."""
    ratios = e.get("ratios") or []
    keys = list(dict.fromkeys(r["key"] for r in ratios))
    cfgs = list(dict.fromkeys(r["figure"] for r in ratios))

    def get(key):
        return lambda g, c: next((r.get(key) for r in ratios if r["key"] == g and r["figure"] == c), None)

    fig, axes = plt.subplots(1, 2, figsize=(14, 5))
    if keys:
        bars(axes[0], keys, cfgs, get("value"), "dhrd / plain directory (higher is better)", log=False)
        w = 0.8 / max(1, len(cfgs))
        for i, c in enumerate(cfgs):
            for j, k in enumerate(keys):
                r = next((r for r in ratios if r["key"] == k and r["figure"] == c), None)
                x = j + i * w
                if r and r.get("target"):
                    axes[0].plot([x - w / 2, x + w / 2], [float(r["target"].strip(">= x"))] * 2, color="k", lw=1.5)
                if r and r.get("value") is None:
                    axes[0].text(x, 0.02, "not measured", rotation=90, ha="center", va="bottom", fontsize=7)
        axes[0].axhline(1.0, color="grey", lw=0.8, ls="--")
        axes[0].set_xticklabels([APPS_LABELS.get(k, k) for k in keys], fontsize=8, rotation=20)
    axes[0].set_title("same-run ratios, fsync mode (black: the target)")
    summary = [s for s in e.get("summary") or [] if s.get("extract_cpu_us_per_file") is not None]
    groups = [("extract_cpu_us_per_file", "extract"), ("reread_cpu_us_per_file", "re-read warm")]
    if summary:
        bars(axes[1], [k for k, _ in groups], [s["config"] for s in summary],
             lambda g, c: next((s.get(g) for s in summary if s["config"] == c), None),
             "daemon CPU per file (us)", log=False)
        axes[1].set_xticklabels([lab for _, lab in groups], fontsize=8)
    axes[1].set_title("the daemon's CPU per file (utime + stime)")
    return fig


PLOTS = {"tier": plot_tier, "blockfs": plot_blockfs, "rehypar": plot_rehypar, "apps": plot_apps}
