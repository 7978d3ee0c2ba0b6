#!/usr/bin/env bash
exec bash "$(dirname "$0")/gpu/run.sh" "$@"  # the old path: the GPU run lives in benchmarks/gpu/
