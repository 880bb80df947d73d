"""Which paper figure each experiment of the suite reproduces, and how it measures it.

Every figure in a report is marked either **as the paper measured** (the paper's method,
scaled to this machine: the same workload and the same kind of figure, so the ratio can
be set beside the paper's) or **our own comparison** (a baseline or a measurement the
paper did not have, or a figure the paper reached another way). A ratio may carry its own
`kind` where an experiment mixes both (the tiered device's estimate and its replay).
"""

AS_PAPER = "as the paper measured"
OWN = "our own comparison"

# experiment -> (the paper figure it reproduces, how its ratios measure it)
REPRODUCES = {
    "block": ("seed 000 Fig. 6 (block level, random 4 KiB, 1-32 processes)", AS_PAPER),
    "replay": ("seed 000 Fig. 7 (SPC traces replayed at block level)", AS_PAPER),
    "file": ("seed 000 Fig. 8 (fio on a file system)", AS_PAPER),
    "fileserver": ("seed 000 Fig. 9 in spirit only: Filebench's fileserver on the FUSE mount, not on the "
                   "block device (experiment blockfs is the figure); Postmark as in seed 003 Fig. 5-6, on dhrd", OWN),
    "blockfs": ("seed 000 Fig. 9 (Filebench fileserver on a file system over the block device)", AS_PAPER),
    "video": ("seed 000 Fig. 12 (read, modify, save a video file)", AS_PAPER),
    "warmup": ("none: seed 000 section 3.3 describes serving I/O during the load, without a figure", OWN),
    "memory": ("none", OWN),
    "transport": ("none", OWN),
    "attach": ("none", OWN),
    "rbd": ("none (SPEC R1: dhrd in front of Ceph RBD)", OWN),
    "cache": ("none (SPEC M1-M5: RAM as a cache of a slower backing)", OWN),
    "nvm": ("seed 004 Fig. 2-7 (I/O mechanisms on emulated NVM)", AS_PAPER),
    "seed002": ("seed 002 Fig. 3-5 (TestDFSIO reads; TPC-C, here pgbench)", AS_PAPER),
    "tier": ("seed 000 Fig. 11 (tiered storage, cache tier at 70% and 80%)",
             "per figure: the paper's estimate from service times, or our own replay"),
    "rehypar": ("seed 003 Fig. 3-6 (ReHypar's write throughput against first-fit file writes)", AS_PAPER),
    "apps": ("none (issue 33: small-file applications on the FUSE mount and the in-place mode)", OWN),
}


def reproduces(name):
    return REPRODUCES.get(name, ("none", OWN))


def kind_of(name, ratio):
    """How one ratio measures its figure: its own `kind`, else the experiment's."""
    if ratio.get("kind"):
        return ratio["kind"]
    if name == "seed002" and "pgbench" in ratio.get("what", ""):
        # TPC-B-like pgbench stands in for the paper's TPC-C on MySQL.
        return OWN
    return reproduces(name)[1]
