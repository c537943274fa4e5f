"""spec.expect's verdict in one place (issue 25): pure functions over report dicts, with thin shells around them.

- :mod:`.reports`: reading report.json, strict JSON (non-finite numbers as null, flagged), and the one
  definition of a report usable as a baseline or in a comparison (:func:`.reports.unusable_reason`).
- :mod:`.identity`: what makes two runs comparable (the job's identity, its environment).
- :mod:`.compare`: a run's per-rollout metrics against a baseline's.
- :mod:`.outcome`: a run's outcome (fits, overBudget, outOfMemory, failed) and spec.expect.outcome's check.
- :mod:`.checks`: the checks of spec.expect (:func:`.checks.check_report`), the outcome's last.
- :mod:`.baseline`: the baseline ConfigMap (what a comparison needs, sized for client-side apply).
- :mod:`.statistics`: a baseline of several runs of one identity (per-rollout and per-rank statistics).
- :mod:`.bands`: bands around those statistics and windows over a run's rollouts; :mod:`.explain`: what differs
  between a run and its references.
- :mod:`.history`: the trusted runs under a results root (spec.expect.baseline.history, ``report history|untrust``).
- :mod:`.shadow`: whether an unmet verdict fails the job (spec.expect.enforce).
- :mod:`.run`: the verdict as ``forge-replay run`` and the in-cluster runtime use it.

The runtime (driver, ``python -m forge_replay.runtime``), the slime / miles publish step, the operator and
``forge-replay report compare|baseline|history|untrust`` (:mod:`forge_replay.commands.report`) call these; none
decides a piece of the verdict itself. Importing the package needs the standard library only.
"""
