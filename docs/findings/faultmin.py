#!/usr/bin/env python3
"""Fault-minutes of etcd campaign runs (docs/findings.md; usage: faultmin.py STORE): per run, the summed duration of every
fault that took effect (inject ok -> heal ok), the wall time under at least one
fault, instant faults counted, the kinds covered, and the verdict."""
import json, os, sys, glob
root = sys.argv[1]
tot_sum = tot_union = tot_dur = 0.0
kinds_all = {}
rows = []
for d in sorted(glob.glob(os.path.join(root, "etcd-campaign", "2*"))):
    h = os.path.join(d, "history.jsonl")
    if not os.path.exists(os.path.join(d, "results.json")):
        continue
    active, windows, instants, last, first = {}, [], {}, 0, None
    last_ok, longest, longest_at = None, 0.0, 0.0
    kinds = {}
    for line in open(h):
        op = json.loads(line)
        t = op["time"] / 1e9
        if first is None and op["process"] != "nemesis":
            first = t
            last_ok = t
        if op["process"] != "nemesis" and op["type"] == "ok":
            if last_ok is not None and t - last_ok > longest:
                longest, longest_at = t - last_ok, last_ok
            last_ok = t
        last = max(last, t)
        if op["process"] != "nemesis" or op["type"] != "ok":
            continue
        f = op["f"]
        v = op.get("value") or {}
        if f == "heal-all":
            for g, s in active.items():
                windows.append((s, t))
            active = {}
        elif f.startswith("heal-"):
            g = f[5:]
            if g in active:
                windows.append((active.pop(g), t))
        elif f in ("restart", "transfer-leader"):
            instants[f] = instants.get(f, 0) + 1
            kinds[f + ":" + v.get("kind", "")] = kinds.get(f + ":" + v.get("kind", ""), 0) + 1
        else:
            active[f] = t
            k = f + ":" + v.get("kind", "")
            kinds[k] = kinds.get(k, 0) + 1
    # the stretch from the last ok to the end of the workload counts too
    wl_end = min(last, first + 300) if first is not None else last
    if last_ok is not None and wl_end - last_ok > longest:
        longest, longest_at = wl_end - last_ok, last_ok
    s = sum(b - a for a, b in windows)
    union, cur = 0.0, None
    for a, b in sorted(windows):
        if cur is None or a > cur[1]:
            if cur: union += cur[1] - cur[0]
            cur = [a, b]
        else:
            cur[1] = max(cur[1], b)
    if cur: union += cur[1] - cur[0]
    res = json.load(open(os.path.join(d, "results.json")))
    cfg = json.load(open(os.path.join(d, "config.json")))
    rows.append((os.path.basename(d), ",".join(cfg["nemesis"]), cfg["etcd"]["workload"], (cfg["etcd"].get("reads", "") if cfg["etcd"]["workload"] == "register" else "–"),
                 cfg["seed"], last / 60, s / 60, union / 60, sum(instants.values()), "%.0fs at %.0fs" % (longest, longest_at), {True: "valid", False: "**invalid**"}.get(res.get("valid"), res.get("valid"))))
    tot_sum += s; tot_union += union; tot_dur += last
    for k, n in kinds.items():
        kinds_all[k] = kinds_all.get(k, 0) + n
print("| # | run | nemesis | workload | reads | seed | run min | fault-min (sum) | fault-min (wall, >=1 fault) | instant faults | longest stretch without an ok op | verdict |")
print("|---|---|---|---|---|---|---|---|---|---|---|---|")
for i, r in enumerate(rows):
    print("| %d | %s | %s | %s | %s | %d | %.1f | %.1f | %.1f | %d | %s | %s |" % ((i,) + r))
print()
print("total: %d runs, %.1f run-minutes, %.1f fault-minutes summed over faults, %.1f wall minutes under >= 1 fault" % (len(rows), tot_dur / 60, tot_sum / 60, tot_union / 60))
print("kinds:", ", ".join("%s x%d" % kv for kv in sorted(kinds_all.items())))
