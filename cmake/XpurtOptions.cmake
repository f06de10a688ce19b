# Helpers for optional dependencies: each one is an option with the values AUTO (use it when found),
# ON (fail the configure step when it is missing) or OFF (never use it).
function(xpurt_dependency_option name doc)
  set(${name} AUTO CACHE STRING "${doc}: AUTO, ON or OFF")
  set_property(CACHE ${name} PROPERTY STRINGS AUTO ON OFF)
endfunction()

function(xpurt_require_if_on name found reason)
  if(${name} STREQUAL "ON" AND NOT ${found})
    message(FATAL_ERROR "${name}=ON but the dependency is unavailable: ${reason}")
  endif()
endfunction()
