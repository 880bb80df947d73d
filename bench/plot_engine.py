#!/usr/bin/python3
"""Plots a `dhrd-bench engine` results.json: one PNG per experiment group, dhrd next to the
baselines of the same run. Usage: /usr/bin/python3 bench/plot_engine.py RESULTS_DIR"""

import json
import sys
from collections import OrderedDict
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


def slug(s):
    return "".join(c if c.isalnum() else "-" for c in s.lower()).strip("-")[:60]


def main():
    out = Path(sys.argv[1])
    data = json.loads((out / "results.json").read_text())
    groups = OrderedDict()
    for r in data["rows"]:
        # Rows repeated only to carry a second ratio are drawn once.
        key = (r["config"], r["threads"])
        g = groups.setdefault(r["experiment"], OrderedDict())
        if key not in g and r["unit"] != "writes/sync mean":
            g[key] = r
    machine = data["machine"]
    foot = f'{machine["cpu"]} x{machine["cores"]}, kernel {machine["kernel"]}, {machine["date_utc"]}'
    for exp, rows in groups.items():
        rows = list(rows.values())
        labels = [f'{r["config"]}\n({r["threads"]} thr)' for r in rows]
        values = [r["value"] for r in rows]
        colors = ["tab:blue" if r["config"].startswith("dhrd") or "chunk" in r["config"] else "tab:gray" for r in rows]
        fig, ax = plt.subplots(figsize=(max(6, 1.5 * len(rows)), 4.5))
        bars = ax.bar(range(len(rows)), values, color=colors)
        for b, r in zip(bars, rows):
            txt = f'{r["value"]:.3g}'
            if r.get("ratio") is not None:
                txt += f'\n{r["ratio"]:.2f}x'
            ax.annotate(txt, (b.get_x() + b.get_width() / 2, b.get_height()), ha="center", va="bottom", fontsize=8)
        ax.set_xticks(range(len(rows)))
        ax.set_xticklabels(labels, fontsize=7)
        unit = rows[0]["unit"]
        better = "lower is better" if rows[0]["lower_is_better"] else "higher is better"
        ax.set_ylabel(f"{unit} ({better})")
        ax.set_title(exp)
        p99 = [r.get("latency_us_p99") for r in rows]
        if "chunk" in exp and all(v is not None for v in p99):
            ax2 = ax.twinx()
            ax2.plot(range(len(rows)), p99, color="tab:red", marker="o")
            ax2.set_ylabel("foreground write p99 during load (us)", color="tab:red")
        fig.text(0.01, 0.01, foot, fontsize=6, color="gray")
        fig.tight_layout(rect=(0, 0.03, 1, 1))
        fig.savefig(out / f"{slug(exp)}.png", dpi=110)
        plt.close(fig)
        print(out / f"{slug(exp)}.png")


if __name__ == "__main__":
    main()
