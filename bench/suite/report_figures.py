"""The plots of the experiments that reproduce one paper figure each: the tiered device
(seed 000 Fig. 11), the fileserver on the block device (Fig. 9) and ReHypar's writes
(seed 003). Each takes matplotlib's pyplot, the experiment's rows and its whole result,
and returns a figure; `report.plot` saves it.
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


PLOTS = {"tier": plot_tier, "blockfs": plot_blockfs, "rehypar": plot_rehypar}
