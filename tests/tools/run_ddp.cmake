# `kiln train --ddp` on 2 ranks against one process with the same (whole) batch
# (cmake -P, from tests/tools/CMakeLists.txt). See Note [Data-parallel training] in
# tools/kiln/train.cpp.
#   KILN     path of the binary
#   MPIRUN_SH  scripts/mpirun.sh
#   ARGS     the training options both runs share (not --batch), separated by '|'
#   DIR      a directory for the checkpoints
# Checks: both exit 0; the per-step losses and the final losses agree to the printed 4
# decimals within 2 units of the last (the runs differ only in how sums are rounded); only
# rank 0 printed (one header) and wrote the checkpoint; a --batch that the ranks cannot
# share is an error on every rank.
string(REPLACE "|" ";" args "${ARGS}")
file(REMOVE_RECURSE "${DIR}")
file(MAKE_DIRECTORY "${DIR}")

function(run_kiln name out_var)
  execute_process(COMMAND ${ARGN} RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
  message("${name}: exit ${rc}\nstdout:\n${out}\nstderr:\n${err}")
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "${name}: expected exit status 0, got '${rc}'")
  endif()
  set(${out_var} "${out}" PARENT_SCOPE)
endfunction()

run_kiln(single single_out "${KILN}" ${args} --batch 4 --out "${DIR}/single.safetensors")
run_kiln(ddp ddp_out "${MPIRUN_SH}" 2 "${KILN}" ${args} --batch 4 --ddp
  --out "${DIR}/ddp.safetensors")

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
losses("${ddp_out}" b)
list(LENGTH a na)
list(LENGTH b nb)
if(na EQUAL 0 OR NOT na EQUAL nb)
  message(FATAL_ERROR "expected the same number of losses, got ${na} (single) and ${nb} (ddp)")
endif()
math(EXPR last "${na} - 1")
foreach(i RANGE ${last})
  list(GET a ${i} x)
  list(GET b ${i} y)
  math(EXPR d "${x} - ${y}")
  if(d GREATER 2 OR d LESS -2)
    message(FATAL_ERROR "loss ${i} differs: ${x} (single) against ${y} (ddp), in units of 1e-4")
  endif()
endforeach()

string(REGEX MATCHALL "kiln train: GPT" headers "${ddp_out}")
list(LENGTH headers nheaders)
if(NOT nheaders EQUAL 1 OR NOT ddp_out MATCHES "ddp: 2 ranks, [0-9]+ sequences each")
  message(FATAL_ERROR "expected rank 0 alone to print, once, with the ddp line")
endif()
if(NOT EXISTS "${DIR}/ddp.safetensors")
  message(FATAL_ERROR "rank 0 did not write the checkpoint")
endif()

execute_process(COMMAND "${MPIRUN_SH}" 2 "${KILN}" ${args} --ddp --batch 3
  --out "${DIR}/odd.safetensors" RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
message("odd batch: exit ${rc}\nstderr:\n${err}")
string(REGEX MATCHALL "kiln: error: \\[train\\] --batch 3 is not a multiple of the 2 ranks"
  lines "${err}")
list(LENGTH lines nlines)
if(rc EQUAL 0 OR NOT nlines EQUAL 2 OR EXISTS "${DIR}/odd.safetensors")
  message(FATAL_ERROR "expected both ranks to reject --batch 3 before training")
endif()
