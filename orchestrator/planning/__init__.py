"""Planning: what the user asked for, checked, and what will run where.

    cluster.yaml --specfile.read_data--> spec.ClusterSpec --plan.make_plan--> plan.Plan

Holds the cluster file's models and their field-named checks (spec, specfile, schedulers),
the restart policy and the strategies' rules (policy, strategy), the quick spec of `tfo run
script.py` (quick, entry), devices, the plan (ports, TF_CONFIG, environments) and exports
(TFJob, JobSet). Pure: no processes, no network, no TensorFlow.

May import: orchestrator.errors, orchestrator.runs, worker_entry.markers. Never the loop,
launching, elastic or the CLI (tests/test_layout.py checks).
"""
