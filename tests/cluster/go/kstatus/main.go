// Command kstatus reads Kubernetes objects as JSON on stdin and prints the status that
// sigs.k8s.io/cli-utils/pkg/kstatus (the library Flux and kpt use) computes for each.
//
// Input: one object, a JSON array of objects, or a List (an object with "items"), or
// several such JSON values one after another.
// Output: one JSON line per object: {"apiVersion","kind","namespace","name","status","message"}.
package main

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	utiljson "k8s.io/apimachinery/pkg/util/json"
	"sigs.k8s.io/cli-utils/pkg/kstatus/status"
)

type verdict struct {
	APIVersion string `json:"apiVersion"`
	Kind       string `json:"kind"`
	Namespace  string `json:"namespace,omitempty"`
	Name       string `json:"name"`
	Status     string `json:"status"`
	Message    string `json:"message"`
}

func objects(value any) ([]map[string]any, error) {
	switch v := value.(type) {
	case []any:
		var out []map[string]any
		for i, item := range v {
			obj, ok := item.(map[string]any)
			if !ok {
				return nil, fmt.Errorf("array item %d is not a JSON object", i)
			}
			out = append(out, obj)
		}
		return out, nil
	case map[string]any:
		if items, ok := v["items"].([]any); ok {
			return objects(items)
		}
		return []map[string]any{v}, nil
	default:
		return nil, errors.New("input is neither a JSON object nor an array of objects")
	}
}

func run(in io.Reader, out io.Writer) error {
	decoder := json.NewDecoder(in)
	encoder := json.NewEncoder(out)
	for {
		var raw json.RawMessage
		if err := decoder.Decode(&raw); errors.Is(err, io.EOF) {
			return nil
		} else if err != nil {
			return fmt.Errorf("reading JSON from stdin: %w", err)
		}
		// Kubernetes' JSON decoding: integers become int64 (metadata.generation, observedGeneration).
		var value any
		if err := utiljson.Unmarshal(raw, &value); err != nil {
			return fmt.Errorf("decoding JSON from stdin: %w", err)
		}
		objs, err := objects(value)
		if err != nil {
			return err
		}
		for _, obj := range objs {
			u := &unstructured.Unstructured{Object: obj}
			result, err := status.Compute(u)
			if err != nil {
				return fmt.Errorf("computing kstatus of %s %s/%s: %w", u.GetKind(), u.GetNamespace(), u.GetName(), err)
			}
			if err := encoder.Encode(verdict{
				APIVersion: u.GetAPIVersion(),
				Kind:       u.GetKind(),
				Namespace:  u.GetNamespace(),
				Name:       u.GetName(),
				Status:     result.Status.String(),
				Message:    result.Message,
			}); err != nil {
				return err
			}
		}
	}
}

func main() {
	if err := run(os.Stdin, os.Stdout); err != nil {
		fmt.Fprintln(os.Stderr, "kstatus:", err)
		os.Exit(1)
	}
}
