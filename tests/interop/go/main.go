// Interop sender: drives a Fluentd forward-protocol server with the real Go
// client github.com/fluent/fluent-logger-golang (Debian's
// golang-github-fluent-fluent-logger-golang-dev, built offline in GOPATH mode
// against /usr/share/gocode; see tests/interop/test_fluent_logger_golang.py).
//
// Usage:
//
//	sender -port P [-host H] -tag-prefix PREFIX -count N -mode sync|async
//	       [-subsecond] [-insecure] [-plaintext] [-timeout 60s]
//
// The client always runs with RequestAck: every Post waits for (sync) or is
// followed by (async) the server's {"ack": chunk}. The library's TLS has no
// CA option (its tls.Config carries only InsecureSkipVerify), so a verified
// connection trusts the system roots: give it the server's CA through Go's
// SSL_CERT_FILE. -insecure sets TlsInsecureSkipVerify instead.
//
// stdout: one JSON line per event posted: {"tag", "time_ns", "record"}, where
// tag is what was passed to Post (the library prepends PREFIX + ".") and
// time_ns the full time passed to PostWithTime (the library sends it whole as
// EventTime with -subsecond, else truncated to seconds).
// stderr: diagnostics.
// exit: 0 only when every Post returned nil and, in async mode, Close flushed
// every event and the result callback saw no error for any of them;
// 1 on any error, 2 when the logger could not be created (connect/TLS),
// 3 on the -timeout watchdog, 64 on usage errors.
package main

import (
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"sync"
	"time"

	"github.com/fluent/fluent-logger-golang/fluent"
)

type sentEvent struct {
	Tag    string                 `json:"tag"`
	TimeNs int64                  `json:"time_ns"`
	Record map[string]interface{} `json:"record"`
}

func main() {
	host := flag.String("host", "127.0.0.1", "server host")
	port := flag.Int("port", 0, "server port")
	prefix := flag.String("tag-prefix", "go", "TagPrefix given to the logger")
	count := flag.Int("count", 25, "events to post")
	mode := flag.String("mode", "sync", "sync or async (Config.Async)")
	subsecond := flag.Bool("subsecond", false, "Config.SubSecondPrecision (EventTime)")
	insecure := flag.Bool("insecure", false, "Config.TlsInsecureSkipVerify")
	plaintext := flag.Bool("plaintext", false, `FluentNetwork "tcp" instead of "tls"`)
	timeout := flag.Duration("timeout", 60*time.Second, "give up (exit 3) after this long")
	flag.Parse()
	if *port <= 0 || *count <= 0 || (*mode != "sync" && *mode != "async") || flag.NArg() != 0 {
		fmt.Fprintln(os.Stderr, "usage error: need -port P, -count N > 0, -mode sync|async")
		os.Exit(64)
	}

	// The library reads acks with no deadline: never hang the test runner.
	time.AfterFunc(*timeout, func() {
		fmt.Fprintf(os.Stderr, "error: not finished within %s\n", *timeout)
		os.Exit(3)
	})

	network := "tls"
	if *plaintext {
		network = "tcp"
	}
	var mu sync.Mutex
	results, failures := 0, 0
	config := fluent.Config{
		FluentHost:            *host,
		FluentPort:            *port,
		FluentNetwork:         network,
		TagPrefix:             *prefix,
		RequestAck:            true,
		Async:                 *mode == "async",
		SubSecondPrecision:    *subsecond,
		TlsInsecureSkipVerify: *insecure,
		Timeout:               5 * time.Second,
		WriteTimeout:          10 * time.Second,
		MaxRetry:              3,
		RetryWait:             100,
		MaxRetryWait:          1000,
		AsyncResultCallback: func(data []byte, err error) {
			mu.Lock()
			defer mu.Unlock()
			results++
			if err != nil {
				failures++
				fmt.Fprintf(os.Stderr, "error: async send: %v\n", err)
			}
		},
	}
	logger, err := fluent.New(config)
	if err != nil {
		fmt.Fprintf(os.Stderr, "error: fluent.New: %v\n", err)
		os.Exit(2)
	}

	// Distinct sub-second parts, so that a lost or rounded nanosecond shows.
	base := time.Now().Truncate(time.Second).Add(-time.Hour)
	sent := make([]sentEvent, 0, *count)
	ok := true
	for i := 0; i < *count; i++ {
		when := base.Add(time.Duration(i)*time.Second + time.Duration(i*1001+7)*time.Nanosecond)
		tag := fmt.Sprintf("%s.app%d", *mode, i%2)
		record := map[string]interface{}{
			"seq":    i,
			"msg":    fmt.Sprintf("hello %d ünïcødé \"quoted\"", i),
			"nested": map[string]interface{}{"a": []interface{}{1, "two", false}},
			"ok":     i%3 == 0,
			"ratio":  float64(i) / 4,
		}
		if err := logger.PostWithTime(tag, when, record); err != nil {
			fmt.Fprintf(os.Stderr, "error: post %d: %v\n", i, err)
			ok = false
			break
		}
		sent = append(sent, sentEvent{Tag: tag, TimeNs: when.UnixNano(), Record: record})
	}
	// Async: Close waits until the run goroutine has written (and had acked)
	// everything queued, as ForceStopAsyncSend is false.
	if err := logger.Close(); err != nil {
		fmt.Fprintf(os.Stderr, "error: close: %v\n", err)
		ok = false
	}
	if *mode == "async" {
		mu.Lock()
		if results != len(sent) || failures != 0 {
			fmt.Fprintf(os.Stderr, "error: async results %d of %d, %d failed\n", results, len(sent), failures)
			ok = false
		}
		mu.Unlock()
	}
	if !ok {
		os.Exit(1)
	}
	out := json.NewEncoder(os.Stdout)
	for _, event := range sent {
		if err := out.Encode(event); err != nil {
			fmt.Fprintf(os.Stderr, "error: stdout: %v\n", err)
			os.Exit(1)
		}
	}
}
