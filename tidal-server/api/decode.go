package api

import (
	"bytes"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"math"
	"net/http"
	"strconv"
	"unsafe"

	"github.com/tidaldb/tidal/tidal-server/ledger"
)

// The request bodies are small, flat JSON objects, decoded by hand in one
// pass instead of through encoding/json, for two reasons:
//
//   - Strictness. encoding/json matches keys case-insensitively ("ID"
//     fills id), keeps the last of duplicate keys, stores null into a
//     float as 0 (so [1,null,1,1] was a valid vector) and reports type
//     errors without array positions. Here keys must match exactly and
//     appear once, null is accepted only where it means "absent", and
//     every error names the field in the request's terms:
//     events[3].weight, vector[17].
//   - Cost. POST /v1/signals is the ingestion path; decoding a batch
//     allocates the events slice and one string per id, nothing per key
//     or number.
//
// Invariant (checked by FuzzDecodeSignals): a body this decoder accepts is
// valid JSON, and encoding/json decodes it to the same values.

// decoder is a cursor over one request body. event is the position of the
// event being decoded in POST /v1/signals (-1 elsewhere); field names in
// errors are built from it only when an error is returned.
type decoder struct {
	data  []byte
	pos   int
	event int
	// text is one string copy of data, made at the first event id: ids
	// without escapes are substrings of it, so a 100-event batch
	// allocates one string for its ids instead of one per event.
	text string
}

// strText decodes the string at the cursor like str, as a string: a
// substring of d.text when the string has no escapes (the decoded bytes
// are then exactly the raw ones; any escape makes them shorter).
func (d *decoder) strText(key string) (string, error) {
	start := d.pos
	b, err := d.str(key)
	if err != nil {
		return "", err
	}
	if len(b) != d.pos-start-2 {
		return string(b), nil
	}
	if d.text == "" {
		d.text = string(d.data)
	}
	return d.text[start+1 : d.pos-1], nil
}

const maxFieldInError = 64 // longer unknown keys are cut in the error's field

func (d *decoder) field(key string) string {
	if len(key) > maxFieldInError {
		key = key[:maxFieldInError] + "..."
	}
	switch {
	case d.event < 0 && key == "":
		return "body"
	case d.event < 0:
		return key
	case key == "":
		return "events[" + strconv.Itoa(d.event) + "]"
	}
	return "events[" + strconv.Itoa(d.event) + "]." + key
}

func (d *decoder) errorf(key, format string, args ...any) *Error {
	return invalid(d.field(key), format, args...)
}

// syntax reports malformed JSON at the cursor.
func (d *decoder) syntax(key, expected string) *Error {
	return d.errorf(key, "malformed JSON at byte %d: expected %s, found %s", d.pos, expected, d.found())
}

// found describes the byte at the cursor for error messages.
func (d *decoder) found() string {
	if d.pos >= len(d.data) {
		return "end of body"
	}
	if k := kind(d.data[d.pos]); k != "" {
		return k
	}
	return strconv.QuoteRune(rune(d.data[d.pos]))
}

// mismatch reports a well-started value of the wrong JSON type.
func (d *decoder) mismatch(key, expected string) *Error {
	if d.pos >= len(d.data) || kind(d.data[d.pos]) == "" {
		return d.syntax(key, expected)
	}
	return d.errorf(key, "expected %s, found %s", expected, kind(d.data[d.pos]))
}

// kind names the JSON type a value starting with c has, or "" when no
// value starts with c.
func kind(c byte) string {
	switch {
	case c == '"':
		return "a string"
	case c == '{':
		return "an object"
	case c == '[':
		return "an array"
	case c == 't' || c == 'f':
		return "a boolean"
	case c == 'n':
		return "null"
	case c == '-' || (c >= '0' && c <= '9'):
		return "a number"
	}
	return ""
}

func (d *decoder) ws() {
	for d.pos < len(d.data) {
		switch d.data[d.pos] {
		case ' ', '\t', '\n', '\r':
			d.pos++
		default:
			return
		}
	}
}

func (d *decoder) peek() byte {
	if d.pos < len(d.data) {
		return d.data[d.pos]
	}
	return 0
}

// null consumes a null literal at the cursor and reports whether there
// was one.
func (d *decoder) null(key string) (bool, error) {
	if d.peek() != 'n' {
		return false, nil
	}
	if len(d.data)-d.pos < 4 || string(d.data[d.pos:d.pos+4]) != "null" {
		return false, d.syntax(key, "null")
	}
	d.pos += 4
	return true, nil
}

// object decodes the object at the cursor, calling member for every key
// with the cursor on its value; member must consume the value. Keys must
// be unique. key names the object in errors.
func (d *decoder) object(key string, member func(name []byte) error) error {
	if d.peek() != '{' {
		return d.mismatch(key, "an object")
	}
	d.pos++
	d.ws()
	if d.peek() == '}' {
		d.pos++
		return nil
	}
	// Every request object has at most a handful of known keys and an
	// unknown one ends decoding, so a short list finds duplicates.
	var seen [8][]byte
	nseen := 0
	for {
		d.ws()
		if d.peek() != '"' {
			return d.syntax(key, "a quoted key")
		}
		name, err := d.str(key)
		if err != nil {
			return err
		}
		for _, s := range seen[:nseen] {
			if string(s) == string(name) {
				return d.errorf(string(name), "duplicate key; each key may appear once")
			}
		}
		if nseen < len(seen) {
			seen[nseen] = name
			nseen++
		}
		d.ws()
		if d.peek() != ':' {
			return d.syntax(key, "':' after a key")
		}
		d.pos++
		d.ws()
		if err := member(name); err != nil {
			return err
		}
		d.ws()
		switch d.peek() {
		case ',':
			d.pos++
		case '}':
			d.pos++
			return nil
		default:
			return d.syntax(key, "',' or '}'")
		}
	}
}

// str decodes the string at the cursor. The result aliases the body when
// the string has no escapes.
func (d *decoder) str(key string) ([]byte, error) {
	if d.peek() != '"' {
		return nil, d.mismatch(key, "a string")
	}
	start := d.pos
	escaped := false
	for d.pos++; d.pos < len(d.data); {
		c := d.data[d.pos]
		switch {
		case c == '"':
			d.pos++
			if !escaped {
				return d.data[start+1 : d.pos-1], nil
			}
			var s string
			if err := json.Unmarshal(d.data[start:d.pos], &s); err != nil {
				d.pos = start
				return nil, d.errorf(key, "malformed JSON string at byte %d: %v", start, err)
			}
			return []byte(s), nil
		case c == '\\':
			escaped = true
			d.pos += 2
		case c < 0x20:
			return nil, d.errorf(key, "malformed JSON at byte %d: control character 0x%02x in a string", d.pos, c)
		default:
			d.pos++
		}
	}
	return nil, d.errorf(key, "malformed JSON at byte %d: unterminated string", start)
}

// number scans the JSON number at the cursor and returns its text.
func (d *decoder) number(key string) ([]byte, error) {
	b, i := d.data, d.pos
	digits := func() bool {
		start := i
		for i < len(b) && b[i] >= '0' && b[i] <= '9' {
			i++
		}
		return i > start
	}
	if i < len(b) && b[i] == '-' {
		i++
	}
	switch {
	case i < len(b) && b[i] == '0':
		i++
	case !digits():
		d.pos = i
		return nil, d.syntax(key, "a digit")
	}
	if i < len(b) && b[i] == '.' {
		i++
		if !digits() {
			d.pos = i
			return nil, d.syntax(key, "a digit after '.'")
		}
	}
	if i < len(b) && (b[i] == 'e' || b[i] == 'E') {
		i++
		if i < len(b) && (b[i] == '+' || b[i] == '-') {
			i++
		}
		if !digits() {
			d.pos = i
			return nil, d.syntax(key, "a digit in the exponent")
		}
	}
	tok := b[d.pos:i]
	d.pos = i
	return tok, nil
}

// quoteNumber shows a number token in an error message, cut if long.
func quoteNumber(tok []byte) string {
	if len(tok) > 40 {
		return string(tok[:40]) + "..."
	}
	return string(tok)
}

// integer decodes the integer at the cursor: its sign and magnitude.
// Fractions and exponents are refused (1.0 and 1e3 are not integers in
// this API, as in encoding/json).
func (d *decoder) integer(key, expected string) (neg bool, mag uint64, err error) {
	if c := d.peek(); c != '-' && (c < '0' || c > '9') {
		return false, 0, d.mismatch(key, expected)
	}
	tok, err := d.number(key)
	if err != nil {
		return false, 0, err
	}
	digits := tok
	if digits[0] == '-' {
		neg, digits = true, digits[1:]
	}
	for _, c := range digits {
		if c < '0' || c > '9' {
			return false, 0, d.errorf(key, "expected %s, found %s", expected, quoteNumber(tok))
		}
		if mag > (math.MaxUint64-uint64(c-'0'))/10 {
			return false, 0, d.errorf(key, "expected %s, found %s (out of range)", expected, quoteNumber(tok))
		}
		mag = mag*10 + uint64(c-'0')
	}
	return neg, mag, nil
}

func (d *decoder) uint64(key string) (uint64, error) {
	const expected = "an unsigned 64-bit integer"
	start := d.pos
	neg, mag, err := d.integer(key, expected)
	if err != nil {
		return 0, err
	}
	if neg {
		return 0, d.errorf(key, "expected %s, found %s", expected, quoteNumber(d.data[start:d.pos]))
	}
	return mag, nil
}

func (d *decoder) int64(key, expected string) (int64, error) {
	start := d.pos
	neg, mag, err := d.integer(key, expected)
	if err != nil {
		return 0, err
	}
	switch {
	case !neg && mag <= math.MaxInt64:
		return int64(mag), nil
	case neg && mag <= math.MaxInt64+1:
		return int64(-mag), nil
	}
	return 0, d.errorf(key, "expected %s, found %s (out of range)", expected, quoteNumber(d.data[start:d.pos]))
}

func (d *decoder) float64(key string) (float64, error) {
	if c := d.peek(); c != '-' && (c < '0' || c > '9') {
		return 0, d.mismatch(key, "a number")
	}
	tok, err := d.number(key)
	if err != nil {
		return 0, err
	}
	f, err := strconv.ParseFloat(string(tok), 64)
	if err != nil {
		return 0, d.errorf(key, "expected a finite number, found %s (out of range)", quoteNumber(tok))
	}
	return f, nil
}

// vector decodes an array of numbers into float32s, refusing null
// elements, anything float32 cannot hold, and more than max components
// (so a huge array is not buffered before its length is refused).
// A null vector is returned as nil.
func (d *decoder) vector(key string, max int) ([]float32, error) {
	if isNull, err := d.null(key); isNull || err != nil {
		return nil, err
	}
	if d.peek() != '[' {
		return nil, d.mismatch(key, "an array of numbers")
	}
	d.pos++
	out := make([]float32, 0, max)
	d.ws()
	if d.peek() == ']' {
		d.pos++
		return out, nil
	}
	for i := 0; ; i++ {
		if i == max {
			return nil, d.errorf(key, "expected %d components, found more", max)
		}
		d.ws()
		if c := d.peek(); c != '-' && (c < '0' || c > '9') {
			return nil, d.mismatch(elemKey(key, i), "a number")
		}
		start := d.pos
		tok, err := d.number("")
		if err != nil {
			// Decode again naming the element: the field is built only
			// for an error, so a good vector allocates nothing per number.
			d.pos = start
			_, err = d.number(elemKey(key, i))
			return nil, err
		}
		// The token is only read by ParseFloat (whose error, which would
		// keep it, is dropped): no copy of each number into a string.
		f, err := strconv.ParseFloat(unsafe.String(unsafe.SliceData(tok), len(tok)), 64)
		if err != nil || math.Abs(f) > math.MaxFloat32 {
			return nil, d.errorf(elemKey(key, i), "%s overflows float32 (largest magnitude %g)", quoteNumber(tok), math.MaxFloat32)
		}
		out = append(out, float32(f))
		d.ws()
		switch d.peek() {
		case ',':
			d.pos++
		case ']':
			d.pos++
			return out, nil
		default:
			return nil, d.syntax(key, "',' or ']'")
		}
	}
}

// body decodes a request body that must be exactly one JSON object,
// calling member for every key (see object).
func decodeBody(body []byte, member func(d *decoder, name []byte) error) error {
	d := &decoder{data: body, event: -1}
	d.ws()
	if d.pos == len(body) {
		return d.errorf("", "empty body; expected a JSON object")
	}
	if d.peek() != '{' {
		return d.mismatch("", "a JSON object")
	}
	if err := d.object("", func(name []byte) error { return member(d, name) }); err != nil {
		return err
	}
	d.ws()
	if d.pos != len(body) {
		return d.errorf("", "unexpected data at byte %d after the JSON object", d.pos)
	}
	return nil
}

// unknown is the error for a key no request of this kind has.
func (d *decoder) unknown(name []byte, known string) *Error {
	return d.errorf(string(name), "unknown field; expected %s", known)
}

// DecodeSignals parses and validates a POST /v1/signals body,
// {"events": [{id, entity, signal, weight?, ts?}, ...]}, against schema.
// Every event is checked before the batch is accepted, so an error always
// names the first bad field (events[3].weight) and nothing is written.
// Errors are *Error: 400, or 413 for more than maxBatch events. Events
// without ts come back with TS 0 for the node to stamp; weight defaults
// to 1. Exported for the fuzz target and for tools that pre-validate
// batches.
func DecodeSignals(body []byte, schema ledger.Schema, maxBatch int) ([]ledger.Event, error) {
	var events []ledger.Event
	found := false
	err := decodeBody(body, func(d *decoder, name []byte) error {
		if string(name) != "events" {
			return d.unknown(name, "events")
		}
		found = true
		if isNull, err := d.null("events"); isNull || err != nil {
			return err
		}
		if d.peek() != '[' {
			return d.mismatch("events", "an array of events")
		}
		d.pos++
		// Every event is an object, so the body's '{' count (less the
		// outer one) is at least the number of events, and exactly it
		// unless ids hold braces; the old len(body)/32 estimate was 2.5×
		// too large for a typical event, and the slice holds pointers the
		// collector scans.
		events = make([]ledger.Event, 0, min(maxBatch, max(1, bytes.Count(body[d.pos:], []byte{'{'}))))
		d.ws()
		if d.peek() == ']' {
			d.pos++
			return nil
		}
		for {
			if len(events) == maxBatch {
				return &Error{Status: http.StatusRequestEntityTooLarge, Code: CodeTooLarge, Field: "events",
					Message: fmt.Sprintf("batch exceeds the limit of %d events", maxBatch)}
			}
			d.ws()
			d.event = len(events)
			e, err := decodeEvent(d, schema)
			if err != nil {
				return err
			}
			events = append(events, e)
			d.event = -1
			d.ws()
			switch d.peek() {
			case ',':
				d.pos++
			case ']':
				d.pos++
				return nil
			default:
				return d.syntax("events", "',' or ']'")
			}
		}
	})
	switch {
	case err != nil:
		return nil, err
	case !found || events == nil:
		return nil, invalid("events", "required: a non-empty array of events")
	case len(events) == 0:
		return nil, invalid("events", "empty batch; expected at least one event")
	}
	return events, nil
}

const eventKeys = "id, entity, signal, weight, ts"

// decodeEvent decodes and validates events[d.event].
func decodeEvent(d *decoder, schema ledger.Schema) (ledger.Event, error) {
	e := ledger.Event{Weight: 1}
	var hasID, hasEntity, hasSignal bool
	err := d.object("", func(name []byte) error {
		// The constant keys keep the error paths from needing a copy of
		// name.
		var key string
		switch string(name) {
		case "id":
			key = "id"
		case "entity":
			key = "entity"
		case "signal":
			key = "signal"
		case "weight":
			key = "weight"
		case "ts":
			key = "ts"
		default:
			return d.unknown(name, eventKeys)
		}
		if isNull, err := d.null(key); isNull || err != nil {
			return err // null is absence: required fields report it below
		}
		var err error
		switch key {
		case "id":
			if e.ID, err = d.strText("id"); err == nil {
				hasID = true
			}
		case "entity":
			e.Entity, err = d.uint64("entity")
			hasEntity = err == nil
		case "signal":
			var b []byte
			if b, err = d.str("signal"); err == nil {
				e.Signal, hasSignal = internSignal(schema, b), true
			}
		case "weight":
			e.Weight, err = d.float64("weight")
		case "ts":
			if e.TS, err = d.int64("ts", "an integer (unix milliseconds)"); err == nil && e.TS == 0 {
				err = d.errorf("ts", "0 is not a timestamp; omit ts to have the node stamp it")
			}
		}
		return err
	})
	switch {
	case err != nil:
		return e, err
	case !hasID:
		return e, d.errorf("id", "required: a client-chosen id, reused on retries")
	case !hasEntity:
		return e, d.errorf("entity", "required: an unsigned 64-bit entity id")
	case !hasSignal:
		return e, d.errorf("signal", "required: one of the schema's signals")
	}
	// The node stamps absent timestamps later; validate with a placeholder
	// inside the accepted range so the rest is checked now.
	check := e
	if check.TS == 0 {
		check.TS = ledger.MinTS
	}
	if fe := schema.ValidateEvent(check); fe != nil {
		return e, d.errorf(fe.Field, "%s", fe.Message)
	}
	return e, nil
}

// internSignal returns the schema's own string for a known signal name,
// so a batch of a million views holds one "view".
func internSignal(schema ledger.Schema, name []byte) string {
	for _, st := range schema.Signals {
		if st.Name == string(name) {
			return st.Name
		}
	}
	return string(name)
}

// elemKey names element i of the array key in errors: "vector[17]".
func elemKey(key string, i int) string { return key + "[" + strconv.Itoa(i) + "]" }

// binaryVector decodes an application/octet-stream vector: exactly dim
// IEEE-754 float32s, little-endian, back to back. Finiteness and the norm
// are checked afterwards like a JSON vector's.
func binaryVector(body []byte, dim int) ([]float32, error) {
	if len(body) != 4*dim {
		return nil, invalid("vector", "expected %d bytes (%d little-endian float32s), found %d", 4*dim, dim, len(body))
	}
	out := make([]float32, dim)
	for i := range out {
		out[i] = math.Float32frombits(binary.LittleEndian.Uint32(body[4*i:]))
	}
	return out, nil
}
