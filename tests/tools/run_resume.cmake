# A `kiln train` run stopped and resumed must end bitwise equal to one never stopped
# (cmake -P, from tests/tools/CMakeLists.txt). Runs the program three times:
#   1. ARGS --out DIR/full.safetensors                      (never stopped)
#   2. ARGS --save-every SAVE_EVERY --stop-after STOP_AFTER --out DIR/resumed.safetensors
#      (stopped, as if killed, after step STOP_AFTER: the checkpoint of step SAVED survives)
#   3. ARGS --resume DIR/resumed.safetensors --out DIR/resumed.safetensors
# and requires the two final checkpoints to be the same file, byte for byte: every tensor
# (model and optimizer state) and every metadata value (steps, generator states, options).
#   KILN        path of the binary
#   ARGS        the arguments all three runs share, separated by '|'
#   DIR         a directory for the checkpoints (created)
#   SAVE_EVERY, STOP_AFTER, SAVED, STEPS  (SAVED: the last multiple of SAVE_EVERY <= STOP_AFTER)
string(REPLACE "|" ";" args "${ARGS}")
file(MAKE_DIRECTORY "${DIR}")
set(full "${DIR}/full.safetensors")
set(resumed "${DIR}/resumed.safetensors")
file(REMOVE "${full}" "${resumed}")

# run(<name> <stdout regex> <extra args>...)
function(run name regex)
  execute_process(COMMAND "${KILN}" ${args} ${ARGN} RESULT_VARIABLE rc OUTPUT_VARIABLE out
    ERROR_VARIABLE err)
  message("${name}: kiln ${args} ${ARGN}\nexit: ${rc}\nstdout:\n${out}\nstderr:\n${err}")
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "${name}: expected exit status 0, got '${rc}'")
  endif()
  if(NOT out MATCHES "${regex}")
    message(FATAL_ERROR "${name}: output does not match '${regex}'")
  endif()
endfunction()

run(uninterrupted "done: ${STEPS} steps" --out "${full}")
run(stopped "step ${SAVED}: checkpoint .*stopped after step ${STOP_AFTER} \\(--stop-after\\)"
  --save-every ${SAVE_EVERY} --stop-after ${STOP_AFTER} --out "${resumed}")
math(EXPR left "${STEPS} - ${SAVED}")
run(resumed "resuming from .* at step ${SAVED}\n.*done: ${left} steps" --resume "${resumed}"
  --out "${resumed}")
execute_process(COMMAND ${CMAKE_COMMAND} -E compare_files "${full}" "${resumed}"
  RESULT_VARIABLE differ)
if(differ)
  message(FATAL_ERROR "the resumed run's checkpoint '${resumed}' differs from the uninterrupted "
    "run's '${full}'")
endif()
