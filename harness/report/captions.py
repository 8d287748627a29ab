"""What each figure of RESULTS.md measures and how to read it: one caption per figure, used under the
figure in RESULTS.md and as its caption in `snakemake --report` (workflow/report/plots.rst). No
imports: the Snakefile reads it."""

PLOTS = {
    "attribution": (
        "Where a token's time goes, per configuration [regime]: the mean steady token's wall time "
        "(median over repeats) stacked by its parts, from the decoding thread's own clocks and the "
        "run cgroup's counters: I/O wait (blocked on the disk), kernel CPU, user CPU, the routing "
        "hook, throttled by the CPU quota, other run-queue wait, sync wait (asleep at a barrier "
        "while the other compute threads run or are throttled), and what none of these explain; "
        "beyond the bar's decode, hatched: the harness's own work until the next decode, which no "
        "tok/s counts. Read it first: a mechanism that is faster must show which part it shrank. A bar mostly "
        "blue is disk-bound; mostly orange, green, red or brown is CPU-bound."),
    "tok_per_s": (
        "Decode speed per configuration: steady tokens per second (the first generated token left "
        "out), the median of the repeats with their min-max as the whisker. Longer is faster; "
        "compare configurations of one regime only, and read the verdicts for whether a "
        "difference is more than noise."),
    "majflt_per_token": (
        "Major page faults per generated token (median of repeats): how often a token waited for "
        "the kernel to read a page of the model. Mechanisms that read experts themselves should "
        "drive this toward zero."),
    "routing_heatmap": (
        "Routing heat map of the longest routing trace: how often each expert (x) of each layer "
        "(y) was routed to. Bright columns are hot experts a cache would keep; a flat map means "
        "every expert is needed and caching helps little."),
    "locality": (
        "Routing locality: the share of routed experts that tokens t and t+d have in common, per "
        "distance d. A high share at d = 1 is what a cache of recent experts, or a prefetch of "
        "the previous token's experts, can use."),
    "cache_simulation": (
        "What any expert cache could do, simulated on the routing trace: the hit rate of LRU, LFU "
        "and Belady's optimum (the oracle) per cache size in experts per layer. The gap between "
        "a policy and the oracle is what a better policy could still win."),
    "policy_study": (
        "What an expert cache of each policy would read per token of the measured window, "
        "replayed on this regime's own routing at the capacity the floor uses (the RAM budget "
        "less the non-expert tensors), from a cold start at the prompt: the page cache reads like "
        "LRU; Belady's optimum needs the future. A mechanism's bytes are held to its own "
        "policy's replay."),
    "time_breakdown": (
        "Time per token of the study's best configuration by the harness's own timers (median "
        "over tokens): pread of expert slabs, compute, madvise and other prefetch work, the "
        "split the study reported (58% I/O, 42% compute)."),
}


def report_category(wildcards) -> str:
    """The report's section of a figure: the attribution first (categories are sorted by name)."""
    name = wildcards.name.rsplit("/", 1)[-1]
    return "1. Where a token's time goes" if name == "attribution" else "2. Figures"
