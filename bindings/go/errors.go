package kalos

import (
	"context"
	"fmt"
	"strconv"
	"strings"
)

// Status is a kalos_status code of the C API (StatusOK = 0; every other value is an error).
type Status int32

var statusNames = [...]string{
	StatusOK:                 "OK",
	StatusInvalidArgument:    "INVALID_ARGUMENT",
	StatusNullPointer:        "NULL_POINTER",
	StatusDimensionMismatch:  "DIMENSION_MISMATCH",
	StatusKOutOfRange:        "K_OUT_OF_RANGE",
	StatusNonFinite:          "NON_FINITE",
	StatusInvalidName:        "INVALID_NAME",
	StatusStoreFull:          "STORE_FULL",
	StatusVersionMismatch:    "VERSION_MISMATCH",
	StatusNotFound:           "NOT_FOUND",
	StatusAlreadyExists:      "ALREADY_EXISTS",
	StatusTimeout:            "TIMEOUT",
	StatusServerGone:         "SERVER_GONE",
	StatusBufferTooSmall:     "BUFFER_TOO_SMALL",
	StatusPayloadTooLarge:    "PAYLOAD_TOO_LARGE",
	StatusCorrupt:            "CORRUPT",
	StatusIO:                 "IO",
	StatusLocked:             "LOCKED",
	StatusBackendUnavailable: "BACKEND_UNAVAILABLE",
	StatusCUDA:               "CUDA",
	StatusPermissionDenied:   "PERMISSION_DENIED",
	StatusTooLarge:           "TOO_LARGE",
	StatusClosed:             "CLOSED",
	StatusPanic:              "PANIC",
	StatusInternal:           "INTERNAL",
	StatusUnavailable:        "UNAVAILABLE",
	StatusStale:              "STALE",
}

// String is the status's stable name, as kalos_status_str gives it ("SERVER_GONE").
func (s Status) String() string {
	if s >= 0 && int(s) < len(statusNames) {
		return statusNames[s]
	}
	return "STATUS_" + strconv.Itoa(int(s))
}

// statusError is the type of the sentinel errors: one value per status code.
type statusError struct {
	status Status
	text   string
}

func (e *statusError) Error() string { return "kalos: " + e.text }

// Status is the code the sentinel stands for.
func (e *statusError) Status() Status { return e.status }

// Sentinel errors, one per status code. Every error the package returns for a failed call
// is an *Error that wraps one of them, so test with errors.Is:
//
//	if errors.Is(err, kalos.ErrServerGone) { reopen() }
//
// and use errors.As with *Error for the status code and the library's message.
var (
	ErrInvalidArgument    error = &statusError{StatusInvalidArgument, "invalid argument"}
	ErrNullPointer        error = &statusError{StatusNullPointer, "null pointer"}
	ErrDimensionMismatch  error = &statusError{StatusDimensionMismatch, "dimension mismatch"}
	ErrKOutOfRange        error = &statusError{StatusKOutOfRange, "k out of range"}
	ErrNonFinite          error = &statusError{StatusNonFinite, "non-finite value (NaN or Inf)"}
	ErrInvalidName        error = &statusError{StatusInvalidName, "invalid store name"}
	ErrStoreFull          error = &statusError{StatusStoreFull, "store full"}
	ErrVersionMismatch    error = &statusError{StatusVersionMismatch, "layout version mismatch"}
	ErrNotFound           error = &statusError{StatusNotFound, "not found"}
	ErrAlreadyExists      error = &statusError{StatusAlreadyExists, "already exists"}
	ErrTimeout            error = &statusError{StatusTimeout, "timeout"}
	ErrServerGone         error = &statusError{StatusServerGone, "server gone"}
	ErrBufferTooSmall     error = &statusError{StatusBufferTooSmall, "buffer too small"}
	ErrPayloadTooLarge    error = &statusError{StatusPayloadTooLarge, "payload too large"}
	ErrCorrupt            error = &statusError{StatusCorrupt, "corrupt data"}
	ErrIO                 error = &statusError{StatusIO, "I/O error"}
	ErrLocked             error = &statusError{StatusLocked, "data directory locked"}
	ErrBackendUnavailable error = &statusError{StatusBackendUnavailable, "backend unavailable"}
	ErrCUDA               error = &statusError{StatusCUDA, "CUDA error"}
	ErrPermissionDenied   error = &statusError{StatusPermissionDenied, "permission denied"}
	ErrTooLarge           error = &statusError{StatusTooLarge, "request too large for a slot"}
	ErrClosed             error = &statusError{StatusClosed, "client closed"}
	ErrPanic              error = &statusError{StatusPanic, "panic in the library"}
	ErrInternal           error = &statusError{StatusInternal, "internal error"}
	ErrUnavailable        error = &statusError{StatusUnavailable, "cluster log or shard hosts unreachable"}
	ErrStale              error = &statusError{StatusStale, "replica may be behind its log"}
)

var sentinels = [...]error{
	StatusInvalidArgument:    ErrInvalidArgument,
	StatusNullPointer:        ErrNullPointer,
	StatusDimensionMismatch:  ErrDimensionMismatch,
	StatusKOutOfRange:        ErrKOutOfRange,
	StatusNonFinite:          ErrNonFinite,
	StatusInvalidName:        ErrInvalidName,
	StatusStoreFull:          ErrStoreFull,
	StatusVersionMismatch:    ErrVersionMismatch,
	StatusNotFound:           ErrNotFound,
	StatusAlreadyExists:      ErrAlreadyExists,
	StatusTimeout:            ErrTimeout,
	StatusServerGone:         ErrServerGone,
	StatusBufferTooSmall:     ErrBufferTooSmall,
	StatusPayloadTooLarge:    ErrPayloadTooLarge,
	StatusCorrupt:            ErrCorrupt,
	StatusIO:                 ErrIO,
	StatusLocked:             ErrLocked,
	StatusBackendUnavailable: ErrBackendUnavailable,
	StatusCUDA:               ErrCUDA,
	StatusPermissionDenied:   ErrPermissionDenied,
	StatusTooLarge:           ErrTooLarge,
	StatusClosed:             ErrClosed,
	StatusPanic:              ErrPanic,
	StatusInternal:           ErrInternal,
	StatusUnavailable:        ErrUnavailable,
	StatusStale:              ErrStale,
}

// Err returns the sentinel error of the status; nil for StatusOK and for codes this
// package does not know (a newer library's).
func (s Status) Err() error {
	if s > 0 && int(s) < len(sentinels) {
		return sentinels[s]
	}
	return nil
}

// Error is a failed call: the operation, the status code and the library's message
// (kalos_last_error of the failing call). It wraps the status's sentinel, and for a
// TIMEOUT whose deadline came from a context also context.DeadlineExceeded.
type Error struct {
	Op      string // "recall", "upsert", ...
	Status  Status
	Message string // the library's message; may be empty

	ctxErr error
}

func (e *Error) Error() string {
	if e.Message == "" {
		return fmt.Sprintf("kalos: %s: %s", e.Op, e.Status)
	}
	// The library's messages usually start with the status name already.
	if strings.HasPrefix(e.Message, e.Status.String()+":") {
		return fmt.Sprintf("kalos: %s: %s", e.Op, e.Message)
	}
	return fmt.Sprintf("kalos: %s: %s: %s", e.Op, e.Status, e.Message)
}

// Unwrap returns the status's sentinel (and the context error, if any) for errors.Is.
func (e *Error) Unwrap() []error {
	errs := make([]error, 0, 2)
	if s := e.Status.Err(); s != nil {
		errs = append(errs, s)
	}
	if e.ctxErr != nil {
		errs = append(errs, e.ctxErr)
	}
	return errs
}

func newError(op string, st Status, msg string) *Error {
	return &Error{Op: op, Status: st, Message: msg}
}

// callError builds the error of a failed C call; a TIMEOUT under a context deadline also
// matches context.DeadlineExceeded.
func callError(op string, st Status, msg string, ctxDeadline bool) error {
	e := newError(op, st, msg)
	if st == StatusTimeout && ctxDeadline {
		e.ctxErr = context.DeadlineExceeded
	}
	return e
}
