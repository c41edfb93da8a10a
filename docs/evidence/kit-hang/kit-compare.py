"""Alternated: the kit before (forked pool, 529a730) and after (exec'd standbys, 345017d),
each from a `git archive` of its commit (with the new bench/kit.py copied into the old one).

    python kit-compare.py ROUNDS [--tfo-only]

Without --tfo-only, each arm is bench/kit.py's pair (10 tests with tf_cluster, then the same
10 with TensorFlow's multi_process_runner, one pytest run each) and the memory its pool holds
between tests (kit.pool_memory); with it, the tf_cluster run alone (multi_process_runner's
runs take 10+ minutes each at load 30-45 and slowed the soak running beside them)."""
import json, os, subprocess, sys, tempfile

ARMS = {"forked (529a730)": "/tmp/kitsafe-before", "exec'd (345017d)": "/tmp/kitsafe-after"}
FULL = ("import json, sys; from pathlib import Path; from bench import kit; "
        "t = Path(sys.argv[1]); p = kit.pairs(t, 1, say=lambda *a: None)[0]; "
        "m = kit.pool_memory(t); "
        "print('RESULT', json.dumps({'tfo': p[0], 'mpr': p[1], 'mem': m}))")
TFO = ("import json, sys; from pathlib import Path; from bench import kit; "
       "t = Path(sys.argv[1]); s = kit.one_run(kit.project(t), 'tfo', t / 'kit-tfo')[0]; "
       "w = kit.warm_starts(t / 'kit-tfo'); "
       "print('RESULT', json.dumps({'tfo': s, 'warm': w}))")
rounds = int(sys.argv[1]) if len(sys.argv) > 1 else 3
code = TFO if "--tfo-only" in sys.argv else FULL
for i in range(rounds):
    names = list(ARMS) if i % 2 == 0 else list(ARMS)[::-1]
    for name in names:
        tmp = tempfile.mkdtemp(prefix="tfo-kitcmp-")
        env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
        load = open("/proc/loadavg").read().split()[:3]
        res = subprocess.run([sys.executable, "-c", code, tmp], cwd=ARMS[name], env=env,
                             capture_output=True, text=True, timeout=3000)
        if "RESULT " not in res.stdout:
            print(f"round {i} {name}: failed {res.stdout[-1500:]} {res.stderr[-1500:]}", flush=True)
            continue
        r = json.loads(res.stdout.split("RESULT ", 1)[1])
        line = (f"round {i} {name}: tf_cluster {r['tfo']:.1f} s for 10 tests "
                f"({r['tfo'] / 10:.2f} s a test)")
        if "warm" in r:
            line += f", {r['warm'][0]} of {r['warm'][1]} tasks warm"
        if "mpr" in r:
            m = r["mem"]
            line += (f", multi_process_runner {r['mpr']:.1f} s, ratio {r['tfo'] / r['mpr']:.2f}; "
                     f"pool between tests: {m['processes']} processes, RSS {m['rss_mib']:.0f} "
                     f"MiB, PSS {m['pss_mib']:.0f} MiB, USS {m['uss_mib']:.0f} MiB")
        print(f"{line}; load at start {' '.join(load)}", flush=True)
        subprocess.run(["rm", "-rf", tmp])
