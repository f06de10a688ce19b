// Symbol visibility for libxpuruntime_core. Everything is hidden unless marked XPURT_API.
#pragma once

#if defined(_WIN32)
#if defined(XPURT_BUILDING_CORE)
#define XPURT_API __declspec(dllexport)
#else
#define XPURT_API __declspec(dllimport)
#endif
#else
#define XPURT_API __attribute__((visibility("default")))
#endif
