# One image for every ctp service in docker-compose.yml: the Airflow components, the
# Spark master and workers, and the ctp CLI. It carries Java (for Spark), Python 3.11,
# the project and its pinned dependencies, so Spark executors can import ctp_state and
# run the reconciler's Python code.
#
#   docker build -t ctp:latest .
FROM python:3.11-slim-bookworm

RUN apt-get update \
 && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends \
      openjdk-17-jre-headless procps tini curl \
 && rm -rf /var/lib/apt/lists/*

ENV JAVA_HOME=/usr/lib/jvm/java-17-openjdk-amd64 \
    PYTHONUNBUFFERED=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    CTP_HOME=/opt/ctp \
    AIRFLOW_HOME=/opt/airflow

WORKDIR /opt/ctp
COPY pyproject.toml README.md ./
COPY ctp_state ./ctp_state
COPY spark_apps ./spark_apps
COPY expectations ./expectations
# The same install as scripts/bootstrap.sh: the Spark provider's pyspark-client
# overwrites pyspark's Python files, so pyspark is reinstalled after it and checked.
RUN pip install --no-cache-dir . \
 && pip install --no-cache-dir --no-deps --force-reinstall pyspark==4.3.0 \
 && python -c "import pyspark, ctp_state, airflow, great_expectations; assert pyspark.__version__ == '4.3.0'"
COPY dags ./dags
COPY scripts ./scripts

# Spark in this image: spark-submit / spark-class come with the pyspark package.
ENV SPARK_HOME=/usr/local/lib/python3.11/site-packages/pyspark \
    PYSPARK_PYTHON=/usr/local/bin/python \
    PATH=/usr/local/lib/python3.11/site-packages/pyspark/bin:$PATH \
    AIRFLOW__CORE__DAGS_FOLDER=/opt/ctp/dags

RUN useradd --create-home --uid 50000 ctp && mkdir -p /opt/airflow && chown -R ctp /opt/airflow /opt/ctp
USER ctp
ENTRYPOINT ["/usr/bin/tini", "--"]
CMD ["ctp", "--help"]
