"""Experiments and benchmarks of dasknn; each module runs as a script (see its docstring).

`EXPERIMENTS` lists the papers' results reproduced in miniature, in the order of
experiments/README.md; each runs with `dasknn experiment NAME` or `python -m experiments.NAME`
and follows the interface in `experiments/common.py`. The `bench_*` modules are benchmarks.
"""

EXPERIMENTS = (
    "batched_lowering",  # 1. Omnivore Fig. 4, CcT Fig. 2
    "lowering_types",  # 2. CcT Fig. 8
    "flops_proportionality",  # 3. Omnivore Fig. 3/11
    "implicit_momentum",  # 4. Omnivore Fig. 6, Theorem 1
    "tradeoff",  # 5. Omnivore Fig. 7
    "momentum_lesion",  # 6. Omnivore Fig. 13
    "cold_start_table",  # 7. Omnivore Table III
    "merged_vs_unmerged",  # 8. Omnivore appendix (merged FC)
    "ps_vs_tree",  # 9. FireCaffe Eq. 3/4
    "sma_vs_sync",  # 10. Crossbow Fig. 9
    "layer_placement",  # 11. RALP Table 2
)
