//! JNI exports (added by the Java binding).
