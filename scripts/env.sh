# Sourced by the scripts: put the venv first on PATH and point Spark at it.
repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
venv="${CTP_VENV:-$repo/.venv}"
export PATH="$venv/bin:$PATH"
export PYSPARK_PYTHON="$venv/bin/python"
export PYSPARK_DRIVER_PYTHON="$venv/bin/python"
export SPARK_HOME="$("$venv/bin/python" -c 'import os, pyspark; print(os.path.dirname(pyspark.__file__))')"
export SPARK_LOCAL_IP="${SPARK_LOCAL_IP:-127.0.0.1}"
