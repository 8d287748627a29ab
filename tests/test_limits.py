"""Kernel-enforced limits: a real cgroup, a real throttle, a real memory ceiling."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from harness import profile_keys
from harness.box import pagecache
from harness.stages import ceilings
from harness.box.limits import Limits, cgroup_version, run_cgroup

pytestmark = pytest.mark.skipif(cgroup_version() is None, reason="no cgroup hierarchy")


def test_odirect_read_is_held_to_the_throttle(tmp_path):
    test = tmp_path / "io.bin"
    ceilings.make_test_file(test, 384 << 20)
    os.sync()  # earlier tests' writeback must not share the disk with the measurement
    limit = 100_000_000  # 100 MB/s
    samples = []
    # 128 MiB a sample: a fresh cgroup's throttle lets a first burst through (on kernel 6.18 a
    # 32 MiB read ran at 140 MB/s under this cap, 128 MiB at 108, 256 MiB at 105)
    for k in range(3):  # a shared machine: the median of three samples at different offsets
        with run_cgroup(Limits(read_bps=limit, device_path=str(tmp_path))) as cg:
            res = subprocess.run([sys.executable, "-m", "harness.stages.ceilings", "odirect", str(test),
                                  str(k * (128 << 20)), str(128 << 20)], capture_output=True,
                                 text=True, preexec_fn=cg.enter)
            assert cg.in_force["read_bps"] == limit
        samples.append(json.loads(res.stdout)["mb_per_s"])
    mbps = sorted(samples)[1]
    assert abs(mbps * 1e6 - limit) / limit < 0.15, samples


def test_random_offsets_are_aligned_distinct_and_cover_the_request():
    offs = ceilings.random_offsets(100 * 8192, 8192, 20 * 8192 + 1, seed=3)
    assert len(offs) == 21 and len(set(offs)) == 21  # rounded up, never the same slab twice
    assert all(o % 8192 == 0 and 0 <= o <= 99 * 8192 for o in offs)
    assert offs != sorted(offs)  # random, not sequential
    assert len(ceilings.random_offsets(10 * 8192, 8192, 1 << 30, seed=0)) == 10  # the whole file


def _random_read(test: Path, access: str, nbytes: int, seed: int, limits: Limits) -> dict:
    pagecache.evict(test)
    with run_cgroup(limits) as cg:
        res = subprocess.run([sys.executable, "-m", "harness.stages.ceilings", "random", str(test),
                              access, "4", str(1 << 20), str(nbytes), str(seed)],
                             capture_output=True, text=True, preexec_fn=cg.enter)
    assert res.returncode == 0, res.stderr
    got = json.loads(res.stdout)
    assert got["bytes"] == nbytes
    return got


def test_random_reads_are_held_to_the_throttle(tmp_path):
    test = tmp_path / "io.bin"
    ceilings.make_test_file(test, 160 << 20)
    os.sync()
    limit = 100_000_000
    # the median of three cold samples each, seeds apart: one 32 MiB sample now and then came out
    # at twice the cap (about 1 run in 10 of this file, before and after the profile registry)
    got = {}
    for access in (ceilings.BUFFERED, ceilings.ODIRECT):
        # 128 MiB each: the throttle's first burst spread out (test_odirect_read_is_held...)
        samples = [_random_read(test, access, 128 << 20, seed,
                                Limits(read_bps=limit, device_path=str(tmp_path)))
                   for seed in (1, 2, 3)]
        got[access] = sorted(samples, key=lambda r: r["mb_per_s"])[1]
    # the throttle holds both kinds (read-ahead may add bytes to a buffered read, never speed)
    assert got[ceilings.ODIRECT]["mb_per_s"] * 1e6 < limit * 1.15, got
    assert got[ceilings.BUFFERED]["mb_per_s"] * 1e6 < limit * 1.15, got
    assert got[ceilings.ODIRECT]["mb_per_s"] * 1e6 > limit * 0.5, got


def test_buffered_random_reads_cost_more_cpu_than_odirect(tmp_path):
    """A buffered read copies every byte through the page cache; O_DIRECT has the device write it.
    Process CPU time is sampled at the scheduler tick (4 ms here), so a few tens of MB cannot
    tell the two apart: 128 MB each, unthrottled, summed over three cold repeats (here buffered
    reads cost 2-3.5x the CPU of O_DIRECT ones)."""
    test = tmp_path / "io.bin"
    ceilings.make_test_file(test, 192 << 20)
    os.sync()
    cpu = {ceilings.BUFFERED: [], ceilings.ODIRECT: []}
    for seed in range(3):
        for access in cpu:
            cpu[access].append(_random_read(test, access, 128 << 20, seed,
                                            Limits(device_path=str(tmp_path)))["cpu_s"])
    assert sum(cpu[ceilings.BUFFERED]) > 1.3 * sum(cpu[ceilings.ODIRECT]), cpu


def test_the_io_ceiling_measures_each_access_at_each_queue_depth(tmp_path):
    rows = ceilings.io_ceiling(tmp_path, [8], Limits(device_path=str(tmp_path)),
                               slab_bytes=300_000, random_mib=4, queue_depths=(1, 4))
    assert [(r["pattern"], r["access"], r["queue_depth"]) for r in rows] == [
        ("sequential", "O_DIRECT", 1),
        ("random", "buffered read", 1), ("random", "buffered read", 4),
        ("random", "O_DIRECT", 1), ("random", "O_DIRECT", 4)]
    assert all(r["block_bytes"] == 303_104 for r in rows[1:])  # a slab rounded up to whole pages
    assert all(r["mb_per_s"] > 0 and r["cpu_s"] >= 0 for r in rows)
    assert not list(tmp_path.glob(".io-*"))


def test_mapping_more_than_the_budget_never_holds_more(tmp_path):
    big = tmp_path / "big.bin"
    ceilings.make_test_file(big, 192 << 20)
    budget = 64 << 20
    code = ("import mmap,sys\nf=open(sys.argv[1],'rb')\nm=mmap.mmap(f.fileno(),0,prot=mmap.PROT_READ)\n"
            "s=0\nfor i in range(0,len(m),4096): s+=m[i]\nprint(s)\n")
    with run_cgroup(Limits(ram_bytes=budget)) as cg:
        res = subprocess.run([sys.executable, "-c", code, str(big)], capture_output=True, text=True,
                             preexec_fn=cg.enter)
        peak = cg.peak_bytes()
    assert res.returncode == 0, res.stderr  # page cache is reclaimed, the process lives
    assert peak <= budget
    assert peak > budget // 2  # it did fill the budget: the limit, not the file, bounded it


def test_cgroup_is_removed_afterwards():
    cg = run_cgroup(Limits(ram_bytes=256 << 20)).open()
    dirs = list(cg.dirs.values())
    assert all(d.exists() for d in dirs)
    cg.close()
    assert not any(d.exists() for d in dirs)


def test_unenforceable_limit_is_an_error_unless_opted_out(monkeypatch, tmp_path):
    from harness.box import limits

    monkeypatch.setattr(limits, "CGROOT", tmp_path / "no-cgroups")
    with pytest.raises(limits.LimitError, match="allow_unenforced"):
        run_cgroup(Limits(ram_bytes=1 << 30)).open()
    cg = run_cgroup(Limits(ram_bytes=1 << 30, allow_unenforced=True)).open()
    assert cg.in_force["ram_bytes"] is None
    cg.close()


def test_eviction_brings_residency_near_zero(tmp_path):
    f = tmp_path / "cached.bin"
    f.write_bytes(os.urandom(8 << 20))
    assert pagecache.warm(f) > 0.99
    before, after = pagecache.cold_start(f)
    assert before > 0.99 and after < 0.01
    assert pagecache.residency(f) < 0.01  # measured again, independently of cold_start's answer


@pytest.mark.parametrize("key", [k.name for k in profile_keys.THROTTLES])
def test_every_declared_throttle_reaches_the_kernel_and_the_record(tmp_path, key):
    """Each throttle of the disk harness.profile_keys declares is written to its own cgroup file
    and recorded in force: a new throttle is its declaration, nothing in box.limits."""
    k = profile_keys.BY_NAME[key]
    value = 123_456_789 if k.unit == "bytes/s" else 321
    with run_cgroup(Limits(**{k.limit: value}, device_path=str(tmp_path))) as cg:
        assert cg.in_force[k.limit] == value
        if cg.version == 1:
            written = (cg.dirs["blkio"] / k.v1_file).read_text().split()
            assert written == [cg.limits.device, str(value)]
        else:
            assert f"{k.v2_key}={value}" in (cg.dirs["unified"] / "io.max").read_text()


def test_read_iops_holds_random_reads_to_their_count(tmp_path):
    """The registry's read_iops is a real kernel limit: 64 KiB O_DIRECT reads at random offsets
    under a 100 IO/s cap run at about 100 a second (the median of three samples; unthrottled
    this disk serves thousands)."""
    test = tmp_path / "io.bin"
    ceilings.make_test_file(test, 32 << 20)
    os.sync()
    # 300 reads, about 3 s at the cap: the throttle lets a first slice's burst through (96 reads
    # measured 115 IO/s), which a longer sample spreads out
    cap, block, nbytes = 100, 64 << 10, 300 * (64 << 10)
    rates = []
    for seed in (1, 2, 3):
        pagecache.evict(test)
        with run_cgroup(Limits(read_iops=cap, device_path=str(tmp_path))) as cg:
            res = subprocess.run([sys.executable, "-m", "harness.stages.ceilings", "random",
                                  str(test), ceilings.ODIRECT, "4", str(block), str(nbytes),
                                  str(seed)], capture_output=True, text=True, preexec_fn=cg.enter)
        assert res.returncode == 0, res.stderr
        rates.append(json.loads(res.stdout)["mb_per_s"] * 1e6 / block)
    iops = sorted(rates)[1]
    assert cap * 0.6 < iops < cap * 1.15, rates
