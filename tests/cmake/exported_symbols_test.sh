#!/usr/bin/env bash
# Every symbol a Kiln library exports names Kiln (Note [Exported symbols] in cmake/kiln.map).
# A library that exports a C++ standard library (or fmt, nlohmann, CUB) symbol takes it over in
# every library loaded after it: GCC emits template statics as STB_GNU_UNIQUE, which the loader
# binds process-wide even under RTLD_LOCAL, so `import kiln; import torch` aborted.
#   exported_symbols_test.sh LIB...
set -euo pipefail
status=0
for lib in "$@"; do
  [[ -f $lib ]] || { echo "exported_symbols_test: no such library: $lib"; exit 1; }
  foreign=$(nm -D --defined-only -C "$lib" | cut -d' ' -f3- | grep -v "kiln" || true)
  if [[ -n $foreign ]]; then
    echo "$lib exports $(wc -l <<< "$foreign") symbols that are not Kiln's, e.g.:"
    head -5 <<< "$foreign" | cut -c1-160
    status=1
  fi
done
exit $status
