"""Bring your own trainer (slime, miles), the running side: the argv injected (``argv``), the entrypoint and runtime
env (``launch``, ``entry``), the memory probe in every Ray worker (``probe``), the publish step after the script
(``publish``) and ``forge-replay run --trainer-root`` (``local``). What slime and miles themselves do is
``forge_replay.frameworks``, a floor below."""
