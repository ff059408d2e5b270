# `kiln train --tp 2` or `--fsdp` on 2 ranks against one process with the same (whole) batch
# (cmake -P, from tests/tools/CMakeLists.txt). See Note [Tensor-parallel training] in
# tools/kiln/train.cpp.
#   KILN       path of the binary
#   MPIRUN_SH  scripts/mpirun.sh
#   MODE       tp or fsdp
#   ARGS       the training options both runs share (not --batch), separated by '|'
#   DIR        a directory for the checkpoints
#   PYTHON     python3 (optional): compare the two checkpoints tensor by tensor
#   COMPARE    tests/tools/compare_checkpoints.py
# Checks: both exit 0; the per-step and evaluation losses agree to the printed 4 decimals
# within 2 units of the last; only rank 0 printed (one header, with the mode's line) and wrote
# the checkpoint; the checkpoint has the single-process run's tensors, shapes and metadata with
# values within tolerance (the fused q, k, v rows in the module's order), and `kiln generate`
# reads it; the run stopped after step 3 and resumed in the mode from its checkpoint (each rank
# loading its pieces) ends with the single-process run's losses and checkpoint; a world that does
# not fit the mode is an error on every rank, before training.
string(REPLACE "|" ";" args "${ARGS}")
file(REMOVE_RECURSE "${DIR}")
file(MAKE_DIRECTORY "${DIR}")
if(MODE STREQUAL "tp")
  set(flag --tp 2)
else()
  set(flag --fsdp)
endif()

function(run_kiln name out_var)
  execute_process(COMMAND ${ARGN} RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
  message("${name}: exit ${rc}\nstdout:\n${out}\nstderr:\n${err}")
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "${name}: expected exit status 0, got '${rc}'")
  endif()
  set(${out_var} "${out}" PARENT_SCOPE)
endfunction()

run_kiln(single single_out "${KILN}" ${args} --batch 4 --out "${DIR}/single.safetensors")
run_kiln(${MODE} sharded_out "${MPIRUN_SH}" 2 "${KILN}" ${args} --batch 4 ${flag}
  --out "${DIR}/${MODE}.safetensors")

# Losses as integers in units of 1e-4: "step 2/4  loss 5.4321" -> 54321.
function(losses text out_var)
  string(REGEX MATCHALL "loss [0-9]+\\.[0-9][0-9][0-9][0-9]" found "${text}")
  set(values "")
  foreach(f ${found})
    string(REGEX REPLACE "^loss ([0-9]+)\\.([0-9]+)$" "\\1\\2" v "${f}")
    string(REGEX REPLACE "^0+([0-9])" "\\1" v "${v}")
    list(APPEND values ${v})
  endforeach()
  set(${out_var} "${values}" PARENT_SCOPE)
endfunction()
losses("${single_out}" a)
losses("${sharded_out}" b)
list(LENGTH a na)
list(LENGTH b nb)
if(na EQUAL 0 OR NOT na EQUAL nb)
  message(FATAL_ERROR "expected the same number of losses, got ${na} (single) and ${nb} (${MODE})")
endif()
math(EXPR last "${na} - 1")
foreach(i RANGE ${last})
  list(GET a ${i} x)
  list(GET b ${i} y)
  math(EXPR d "${x} - ${y}")
  if(d GREATER 2 OR d LESS -2)
    message(FATAL_ERROR "loss ${i} differs: ${x} (single) against ${y} (${MODE}), in units of 1e-4")
  endif()
endforeach()

string(REGEX MATCHALL "kiln train: GPT" headers "${sharded_out}")
list(LENGTH headers nheaders)
if(NOT nheaders EQUAL 1 OR NOT sharded_out MATCHES "\n${MODE}: 2 ranks, ")
  message(FATAL_ERROR "expected rank 0 alone to print, once, with the '${MODE}: 2 ranks' line")
endif()
if(NOT EXISTS "${DIR}/${MODE}.safetensors")
  message(FATAL_ERROR "rank 0 did not write the checkpoint")
endif()
if(PYTHON)
  run_kiln(compare compare_out "${PYTHON}" "${COMPARE}" "${DIR}/${MODE}.safetensors"
    "${DIR}/single.safetensors")
endif()
run_kiln(generate generate_out "${KILN}" generate --ckpt "${DIR}/${MODE}.safetensors" --prompt GNU
  --tokens 5 --threads 1)
if(NOT generate_out MATCHES "^GNU")
  message(FATAL_ERROR "kiln generate did not continue the prompt from the ${MODE} checkpoint")
endif()

# Stopped after step 3 and resumed in the mode: the same losses from step 4 on and the same
# final checkpoint as the uninterrupted single-process run.
run_kiln(${MODE}_stopped stopped_out "${MPIRUN_SH}" 2 "${KILN}" ${args} --batch 4 ${flag}
  --stop-after 3 --out "${DIR}/stopped.safetensors")
run_kiln(${MODE}_resumed resumed_out "${MPIRUN_SH}" 2 "${KILN}" ${args} --batch 4 ${flag}
  --resume "${DIR}/stopped.safetensors" --out "${DIR}/resumed.safetensors")
if(NOT resumed_out MATCHES "resuming from [^\n]*stopped.safetensors at step 3")
  message(FATAL_ERROR "the ${MODE} run did not resume at step 3")
endif()
# Its losses (steps 4 to the end, the final evaluation) are the single-process run's last ones.
losses("${resumed_out}" r)
list(LENGTH r nr)
math(EXPR skip "${na} - ${nr}")
if(nr EQUAL 0 OR skip LESS 1)
  message(FATAL_ERROR "expected fewer losses from the resumed run, got ${nr} (single: ${na})")
endif()
math(EXPR last "${nr} - 1")
foreach(i RANGE ${last})
  math(EXPR j "${i} + ${skip}")
  list(GET a ${j} x)
  list(GET r ${i} y)
  math(EXPR d "${x} - ${y}")
  if(d GREATER 2 OR d LESS -2)
    message(FATAL_ERROR "resumed loss ${i} differs: ${x} (single) against ${y} (${MODE}), in "
      "units of 1e-4")
  endif()
endforeach()
if(PYTHON)
  run_kiln(compare_resumed compare_resumed_out "${PYTHON}" "${COMPARE}"
    "${DIR}/resumed.safetensors" "${DIR}/single.safetensors")
endif()

# A world the mode cannot use: --tp 3 on 2 ranks; --fsdp with a batch the ranks cannot share.
if(MODE STREQUAL "tp")
  set(bad --tp 3 --batch 4)
  set(want "kiln: error: \\[train\\] --tp 3 must equal the number of ranks \\(2;")
else()
  set(bad --fsdp --batch 3)
  set(want "kiln: error: \\[train\\] --batch 3 is not a multiple of the 2 ranks \\(--fsdp\\)")
endif()
execute_process(COMMAND "${MPIRUN_SH}" 2 "${KILN}" ${args} ${bad} --out "${DIR}/bad.safetensors"
  RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
message("bad world: exit ${rc}\nstderr:\n${err}")
string(REGEX MATCHALL "${want}" lines "${err}")
list(LENGTH lines nlines)
if(rc EQUAL 0 OR NOT nlines EQUAL 2 OR EXISTS "${DIR}/bad.safetensors")
  message(FATAL_ERROR "expected both ranks to refuse '${bad}' before training")
endif()
