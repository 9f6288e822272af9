package amqpnames

import (
	"bytes"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// root is the module's root, two directories up.
const root = "../.."

// spellings are the quoted literals that declare a broker name or read
// x-death, and the one file of this package allowed to hold each.
var spellings = map[string]string{
	`".retry"`:            "internal/amqpnames/names.go",
	`".dlq"`:              "internal/amqpnames/names.go",
	`".p"`:                "internal/amqpnames/names.go",
	`"x-consistent-hash"`: "internal/amqpnames/names.go",
	`"x-idem-`:            "internal/amqpnames/names.go",
	`"x-death"`:           "internal/amqpnames/deaths.go",
	`"x-first-death-`:     "internal/amqpnames/deaths.go",
	`"x-last-death-`:      "internal/amqpnames/deaths.go",
}

// outsideFiles are the module's non-test Go files but the test kit's (which
// may spell names to check them from outside): the library, the command,
// the examples and the benchmarks.
func outsideFiles(t *testing.T) []string {
	t.Helper()
	var files []string
	err := filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(root, path)
		rel = filepath.ToSlash(rel)
		if d.IsDir() {
			if rel != "." && (strings.HasPrefix(d.Name(), ".") || d.Name() == "testdata" || rel == "internal/testkit") {
				return filepath.SkipDir
			}
			return nil
		}
		if strings.HasSuffix(rel, ".go") && !strings.HasSuffix(rel, "_test.go") {
			files = append(files, rel)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return files
}

// A broker name, idem's headers and the reading of x-death have one home,
// this package: a queue's retry, dead-letter and partition queues, the
// partition exchange's type, the x-idem- headers, and x-death are spelt
// nowhere else outside tests and the test kit, in code or in comments.
// Everything else asks this package (or its public faces: package
// partitions, deadletters.QueueName and deadletters' Header constants,
// consumer.Consumer.Queues).
func TestBrokerNamesAreSpeltOnlyInTheirHome(t *testing.T) {
	files := outsideFiles(t)
	if len(files) < 100 {
		t.Fatalf("found %d Go files under %s: not the module's root?", len(files), root)
	}
	for _, rel := range files {
		src, err := os.ReadFile(filepath.Join(root, rel))
		if err != nil {
			t.Fatal(err)
		}
		for spelling, home := range spellings {
			if rel != home && bytes.Contains(src, []byte(spelling)) {
				t.Errorf("%s spells %s, whose home is %s: ask package amqpnames, or from an example its public faces", rel, spelling, home)
			}
		}
	}
	for spelling, home := range spellings {
		src, err := os.ReadFile(filepath.Join(root, home))
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Contains(src, []byte(spelling)) {
			t.Errorf("%s no longer spells %s: move its entry in spellings to its new home", home, spelling)
		}
	}
}
