"""An alert hook for the GC DAG test: ``CTP_ALERT_CALLBACK=tests.dags.alert_hook:record``
appends the failed task's exception to ``$CTP_TEST_ALERT_FILE``."""

from __future__ import annotations

import os
from typing import Any


def record(context: Any) -> None:
    with open(os.environ["CTP_TEST_ALERT_FILE"], "a") as f:
        f.write(f"{context['ti'].task_id}: {context['exception']}\n")
