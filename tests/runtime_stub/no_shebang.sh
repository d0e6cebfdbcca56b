echo a script without a #! line: egpu-run refuses it as env does (test_egpu_run.py)
