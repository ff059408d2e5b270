# Runs the kiln program once and checks how it ended (cmake -P, from tests/tools/CMakeLists.txt).
#   KILN      path of the binary
#   ARGS      its arguments, separated by '|'
#   FAIL      ON: it must exit non-zero with exactly one stderr line "kiln: error: ...";
#             OFF: it must exit 0
#   REGEX     (optional) must match stderr when FAIL, stdout otherwise
#   ERR_REGEX (optional) must match stderr (diagnostics a successful run prints there)
#   FILE      (optional) must exist afterwards
#   JSON_KEY  (optional) stdout must be a JSON object with this numeric key
string(REPLACE "|" ";" args "${ARGS}")
if(FILE)
  file(REMOVE "${FILE}")
endif()
execute_process(COMMAND "${KILN}" ${args} RESULT_VARIABLE rc OUTPUT_VARIABLE out
  ERROR_VARIABLE err)
message("kiln ${args}\nexit: ${rc}\nstdout:\n${out}\nstderr:\n${err}")
if(FAIL)
  # A signal (abort, segfault) comes back as text, not a number.
  if(NOT rc MATCHES "^[0-9]+$" OR rc EQUAL 0)
    message(FATAL_ERROR "expected a non-zero exit status, got '${rc}'")
  endif()
  if(NOT err MATCHES "^kiln: error: [^\n]+\n$")
    message(FATAL_ERROR "expected exactly one stderr line starting 'kiln: error: '")
  endif()
  set(checked "${err}")
else()
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "expected exit status 0, got '${rc}'")
  endif()
  set(checked "${out}")
endif()
if(DEFINED REGEX AND NOT checked MATCHES "${REGEX}")
  message(FATAL_ERROR "output does not match '${REGEX}'")
endif()
if(DEFINED ERR_REGEX AND NOT err MATCHES "${ERR_REGEX}")
  message(FATAL_ERROR "stderr does not match '${ERR_REGEX}'")
endif()
if(FILE AND NOT EXISTS "${FILE}")
  message(FATAL_ERROR "'${FILE}' was not written")
endif()
if(JSON_KEY)
  string(JSON value ERROR_VARIABLE json_err GET "${out}" "${JSON_KEY}")
  if(json_err OR NOT value MATCHES "^[0-9.eE+-]+$")
    message(FATAL_ERROR "no numeric '${JSON_KEY}' in the JSON output: ${json_err}")
  endif()
endif()
