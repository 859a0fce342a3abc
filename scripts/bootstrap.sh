#!/usr/bin/env bash
# Build the project's virtualenv from the package registries alone; install a JRE 17 if java is missing.
set -euo pipefail
VENV=${VENV:-.venv}
PYTHON=${PYTHON:-python3}

java_major() { java -version 2>&1 | awk -F'"' '/version/ {split($2, v, "."); print (v[1] == "1" ? v[2] : v[1]); exit}'; }
if ! command -v java >/dev/null 2>&1 || [ "$(java_major)" -lt 17 ]; then
  if command -v apt-get >/dev/null 2>&1; then
    echo "bootstrap: installing a Java 17 runtime (pyspark 4 needs Java 17+)"
    SUDO=""; [ "$(id -u)" -eq 0 ] || SUDO="sudo"
    $SUDO apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq openjdk-17-jre-headless >/dev/null
  else
    echo "bootstrap: Java 17+ is required for pyspark 4; install it and re-run" >&2
    exit 1
  fi
fi

if [ ! -x "$VENV/bin/python" ]; then
  "$PYTHON" -m venv "$VENV"
fi
"$VENV/bin/python" -m pip install -q --upgrade pip
"$VENV/bin/python" -m pip install -q -e ".[tf,spark,demo,test,tfos]"
touch "$VENV/.installed"
